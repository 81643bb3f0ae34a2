"""Tests of the package that need neither a GPU nor torch: import, version, the exception
classes, and the native layer's own checks of tensor-like objects (`__cuda_array_interface__`,
DLPack capsules, the torch layer's description tuples)."""

import ctypes
import pathlib
import re

import pytest

import devcomm

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_version_is_the_crates():
    cargo = (ROOT / "Cargo.toml").read_text()
    want = re.search(r'^version = "([^"]+)"', cargo, re.M).group(1)
    assert devcomm.__version__ == want


def test_exception_classes_form_one_hierarchy():
    for cls in (
        devcomm.InvalidArgument,
        devcomm.PeerTimeout,
        devcomm.Aborted,
        devcomm.CountOverflow,
        devcomm.CudaError,
        devcomm.CompileError,
        devcomm.SetupError,
        devcomm.NotBuiltError,
        devcomm.PoolExhausted,
    ):
        assert issubclass(cls, devcomm.Error) and cls is not devcomm.Error
    assert issubclass(devcomm.Error, Exception)
    assert devcomm.PeerTimeout.__module__ == "devcomm"


def test_the_pool_allocator_functions_are_exported_and_refuse_without_a_pool():
    # What torch.cuda.memory.CUDAPluggableAllocator looks up in the native library, with the
    # signatures torch calls: void* alloc(ssize_t, int, cudaStream_t) and
    # void free(void*, ssize_t, int, cudaStream_t).
    import ctypes

    lib = ctypes.CDLL(devcomm._native.__file__)
    malloc, free = lib.devcomm_pool_malloc, lib.devcomm_pool_free
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    free.restype, free.argtypes = None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    assert devcomm._native.pool_last_error(97) is None
    assert malloc(1 << 20, 97, None) is None
    assert "no devcomm memory pool on CUDA device 97" in devcomm._native.pool_last_error(97)
    free(4096, 256, 98, None)
    assert "pool free" in devcomm._native.pool_last_error(98)


def test_joining_without_the_environment_names_the_variable(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(devcomm.Error, match="RANK"):
        devcomm._native.Comm.from_env()


# --- __cuda_array_interface__ -------------------------------------------------------------


class Cai:
    def __init__(self, **fields):
        self.__cuda_array_interface__ = {
            "version": 3,
            "shape": (4, 3),
            "typestr": "<f4",
            "data": (4096, False),
            "strides": None,
            **fields,
        }


def test_cuda_array_interface_is_read():
    assert devcomm.describe(Cai()) == (4096, "float32", [4, 3], None, -1)
    # Strides come in bytes and are given back in elements.
    assert devcomm.describe(Cai(strides=(12, 4)))[3] == [3, 1]
    assert devcomm.describe(Cai(typestr="|u1", shape=(5,)))[1:3] == ("uint8", [5])
    devcomm.check_tensor(Cai(strides=(12, 4)))
    devcomm.check_tensor(Cai(shape=(4, 1), strides=(4, 400)))  # a unit dimension's stride is free


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"strides": (4, 16)}, "not contiguous"),
        ({"strides": (12, 2)}, "not whole 4-byte elements"),
        ({"typestr": ">f4"}, 'typestr ">f4"'),
        ({"typestr": "<f3"}, 'typestr "<f3"'),
        ({"version": 1}, "version 1"),
        ({"data": 4096}, "data must be"),
        ({"mask": object()}, "masked"),
        ({"data": (0, False)}, "null data pointer"),
        ({"data": (4098, False)}, "not aligned"),
    ],
)
def test_cuda_array_interface_errors(fields, match):
    with pytest.raises(devcomm.InvalidArgument, match=match) as e:
        devcomm.check_tensor(Cai(**fields))
    assert e.value.op == "check_tensor"


def test_a_missing_key_is_named():
    obj = Cai()
    del obj.__cuda_array_interface__["shape"]
    with pytest.raises(devcomm.InvalidArgument, match="no `shape`"):
        devcomm.describe(obj)


def test_an_empty_tensor_needs_no_pointer():
    devcomm.check_tensor(Cai(shape=(0, 3), data=(0, False)))


def test_wrong_dtype_is_refused():
    with pytest.raises(devcomm.InvalidArgument, match="dtype float32; expected int64"):
        devcomm.check_tensor(Cai(), dtypes=["int64"])


# --- DLPack -------------------------------------------------------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class FakeDlpack:
    """An object whose `__dlpack__` returns a capsule over a DLTensor built with ctypes (no
    destructor: the test keeps the structs alive)."""

    def __init__(self, device_type=2, device_id=0, code=2, bits=32, lanes=1, shape=(2, 8),
                 strides=None, data=1 << 20, byte_offset=0, name=b"dltensor", versioned=False,
                 version=1, report_device=True):
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
        t = DLTensor(
            data, DLDevice(device_type, device_id), len(shape), DLDataType(code, bits, lanes),
            self.shape, self.strides, byte_offset,
        )
        if versioned:
            self.managed = DLManagedTensorVersioned(version, 0, None, None, 0, t)
        else:
            self.managed = DLManagedTensor(t, None, None)
        self.name = name
        self.device = (device_type, device_id)
        self.report_device = report_device
        self.streams = []

    def __dlpack__(self, stream=None, **_):
        self.streams.append(stream)
        return _capsule_new(ctypes.addressof(self.managed), self.name, None)

    def __getattr__(self, attr):
        if attr == "__dlpack_device__" and self.report_device:
            return lambda: self.device
        raise AttributeError(attr)


def test_dlpack_capsules_are_read_without_being_consumed():
    obj = FakeDlpack(shape=(2, 8), byte_offset=64)
    assert devcomm.describe(obj, stream=7) == ((1 << 20) + 64, "float32", [2, 8], None, 0)
    assert obj.streams == [7]
    # Stream 0 (the legacy default stream) is 1 in DLPack's numbering.
    devcomm.describe(obj)
    assert obj.streams[-1] == 1
    v = FakeDlpack(versioned=True, code=4, bits=16, strides=(8, 1), name=b"dltensor_versioned")
    assert devcomm.describe(v) == (1 << 20, "bfloat16", [2, 8], [8, 1], 0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"device_type": 1}, "on cpu, not on a CUDA device"),
        ({"device_type": 1, "report_device": False}, "on cpu, not on a CUDA device"),
        ({"device_type": 13, "report_device": False}, "CUDA managed memory"),
        ({"name": b"used_dltensor"}, "capsule named \"used_dltensor\""),
        ({"name": b"dltensor_versioned", "versioned": True, "version": 2}, "DLPack version 2"),
        ({"lanes": 4}, "lanes 4"),
        ({"code": 3, "bits": 8}, "code 3"),
        ({"strides": (1, 2)}, "not contiguous"),
        ({"device_id": 1}, "on cuda:1; this communicator uses cuda:0"),
        ({"data": 3}, "not aligned"),
    ],
)
def test_dlpack_errors(kwargs, match):
    with pytest.raises(devcomm.InvalidArgument, match=match):
        devcomm.check_tensor(FakeDlpack(**kwargs), ordinal=0)


def test_dlpack_device_is_checked_before_the_capsule_is_made():
    obj = FakeDlpack(device_type=1)
    with pytest.raises(devcomm.InvalidArgument, match="on cpu"):
        devcomm.check_tensor(obj)
    assert obj.streams == []


def test_a_dlpack_method_that_returns_no_capsule_is_refused():
    class NotACapsule:
        def __dlpack__(self, stream=None):
            return 42

    with pytest.raises(devcomm.InvalidArgument, match="did not return a capsule"):
        devcomm.describe(NotACapsule())


# --- description tuples and other objects -------------------------------------------------


def test_description_tuples():
    assert devcomm.describe((256, "bfloat16", (3, 2), (2, 1), 1)) == (256, "bfloat16", [3, 2], [2, 1], 1)
    with pytest.raises(devcomm.InvalidArgument, match="is on cpu"):
        devcomm.check_tensor((256, "float32", (3,), (1,), -1))
    with pytest.raises(devcomm.InvalidArgument, match="dtype float128, which devcomm does not move"):
        devcomm.describe((256, "float128", (3,), (1,), 0))
    with pytest.raises(devcomm.InvalidArgument, match="bad tensor description"):
        devcomm.describe((256, "float32", (3,)))
    with pytest.raises(devcomm.InvalidArgument, match="not contiguous"):
        devcomm.check_tensor((256, "float32", (3, 4), (1, 3), 0))


@pytest.mark.parametrize("obj", [None, 3, "tensor", [1, 2], object()])
def test_other_objects_are_refused(obj):
    with pytest.raises(devcomm.InvalidArgument, match="expected a CUDA tensor"):
        devcomm.describe(obj)


# --- hooks --------------------------------------------------------------------------------

SCALE = """
struct Scale2 {
  using In = float; using Out = float; using Wire = float;
  static __device__ devcomm::Tile<float> produce(const devcomm::Ctx& c) { return devcomm::load_tile<float>(c); }
  static __device__ void consume(const devcomm::Ctx& c, const devcomm::Tile<float>& t) { devcomm::store_tile<float>(c, t); }
};
"""


def test_hooks_take_the_first_struct_and_the_dtypes_sizes():
    h = devcomm.Hooks(SCALE, in_dtype="float32", out_dtype="bfloat16")
    assert h.name == "Scale2"
    assert (h._native.in_size, h._native.out_size) == (4, 2)
    assert devcomm.Hooks(SCALE, name="Other")._native.name == "Other"


@pytest.mark.parametrize(
    "args, match",
    [
        (("",), "source must be"),
        (("int x;",), "no `struct NAME`"),
        ((SCALE, "Scale2", "float128"), "float128"),
        ((SCALE, "bad name;"), "not the name of a C\\+\\+ struct"),
    ],
)
def test_hooks_errors(args, match):
    with pytest.raises(devcomm.InvalidArgument, match=match):
        devcomm.Hooks(*args)


def test_native_hooks_refuse_sizes_the_collectives_do_not_take():
    with pytest.raises(devcomm.InvalidArgument, match="element size 3"):
        devcomm._native.Hooks("Scale2", SCALE, 3, 4)
