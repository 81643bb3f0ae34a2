//! What the native layer knows of a tensor: a [`TensorDesc`] (address, dtype, shape, strides,
//! device) read from one of three forms, and the checks every operation makes before anything
//! runs.
//!
//! - A description tuple `(ptr, dtype, shape, strides, device)` from the package's torch layer:
//!   `dtype` a name (`"float32"`, `"bfloat16"`, ...), `strides` in elements, `device` the CUDA
//!   ordinal or a string naming another device (`"cpu"`).
//! - An object with `__cuda_array_interface__` (version 2 or 3; strides in bytes; the device is
//!   taken to be the communicator's, the interface carrying none).
//! - An object with `__dlpack__` (and `__dlpack_device__`): its capsule, `dltensor` or
//!   `dltensor_versioned`, is read and left unconsumed, so the producer frees it.

use std::ffi::{c_void, CStr};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use crate::errors::invalid;

/// Element types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    Bool,
    U8,
    I8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    F16,
    BF16,
    F32,
    F64,
    F8E4M3,
    F8E5M2,
    C64,
    C128,
}

const NAMES: [(DType, &str); 17] = [
    (DType::Bool, "bool"),
    (DType::U8, "uint8"),
    (DType::I8, "int8"),
    (DType::I16, "int16"),
    (DType::U16, "uint16"),
    (DType::I32, "int32"),
    (DType::U32, "uint32"),
    (DType::I64, "int64"),
    (DType::U64, "uint64"),
    (DType::F16, "float16"),
    (DType::BF16, "bfloat16"),
    (DType::F32, "float32"),
    (DType::F64, "float64"),
    (DType::F8E4M3, "float8_e4m3fn"),
    (DType::F8E5M2, "float8_e5m2"),
    (DType::C64, "complex64"),
    (DType::C128, "complex128"),
];

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 | DType::F8E4M3 | DType::F8E5M2 => 1,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 | DType::C64 => 8,
            DType::C128 => 16,
        }
    }

    /// The torch-style name.
    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|(d, _)| *d == self)
            .map_or("?", |(_, n)| n)
    }

    /// From a torch-style name.
    pub fn from_name(name: &str) -> Option<Self> {
        NAMES.iter().find(|(_, n)| *n == name).map(|(d, _)| *d)
    }

    /// From a `__cuda_array_interface__` type string (`<f4`, `|u1`, ...; little-endian or
    /// not applicable only).
    pub fn from_typestr(s: &str) -> Option<Self> {
        let b = s.as_bytes();
        if b.len() < 3 || !matches!(b[0], b'<' | b'|') {
            return None;
        }
        let bytes: usize = s[2..].parse().ok()?;
        Some(match (b[1], bytes) {
            (b'b', 1) => DType::Bool,
            (b'u', 1) => DType::U8,
            (b'i', 1) => DType::I8,
            (b'i', 2) => DType::I16,
            (b'u', 2) => DType::U16,
            (b'i', 4) => DType::I32,
            (b'u', 4) => DType::U32,
            (b'i', 8) => DType::I64,
            (b'u', 8) => DType::U64,
            (b'f', 2) => DType::F16,
            (b'f', 4) => DType::F32,
            (b'f', 8) => DType::F64,
            (b'c', 8) => DType::C64,
            (b'c', 16) => DType::C128,
            _ => return None,
        })
    }

    /// The DLPack `(code, bits)` of this dtype (the inverse of [`DType::from_dlpack`]).
    pub fn to_dlpack(self) -> (u8, u8) {
        let bits = (self.size() * 8) as u8;
        let code = match self {
            DType::I8 | DType::I16 | DType::I32 | DType::I64 => 0,
            DType::U8 | DType::U16 | DType::U32 | DType::U64 => 1,
            DType::F16 | DType::F32 | DType::F64 => 2,
            DType::BF16 => 4,
            DType::C64 | DType::C128 => 5,
            DType::Bool => 6,
            DType::F8E4M3 => 8,
            DType::F8E5M2 => 10,
        };
        (code, bits)
    }

    /// From a DLPack `DLDataType` (one lane only).
    pub fn from_dlpack(code: u8, bits: u8, lanes: u16) -> Option<Self> {
        if lanes != 1 {
            return None;
        }
        Some(match (code, bits) {
            (0, 8) => DType::I8,
            (0, 16) => DType::I16,
            (0, 32) => DType::I32,
            (0, 64) => DType::I64,
            (1, 8) => DType::U8,
            (1, 16) => DType::U16,
            (1, 32) => DType::U32,
            (1, 64) => DType::U64,
            (2, 16) => DType::F16,
            (2, 32) => DType::F32,
            (2, 64) => DType::F64,
            (4, 16) => DType::BF16,
            (5, 64) => DType::C64,
            (5, 128) => DType::C128,
            (6, 8) => DType::Bool,
            (10, 8) => DType::F8E5M2, // kDLFloat8_e5m2
            (8, 8) => DType::F8E4M3,  // kDLFloat8_e4m3fn
            _ => return None,
        })
    }
}

/// Where a tensor lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Device {
    /// A CUDA device by ordinal.
    Cuda(i64),
    /// CUDA, device not stated (`__cuda_array_interface__`).
    CudaUnstated,
    /// Anything else, by name.
    Other(String),
}

/// A tensor as the native layer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorDesc {
    pub ptr: u64,
    pub dtype: DType,
    pub shape: Vec<i64>,
    /// In elements; `None`: contiguous.
    pub strides: Option<Vec<i64>>,
    pub device: Device,
}

impl TensorDesc {
    pub fn numel(&self) -> u64 {
        self.shape.iter().map(|&d| d.max(0) as u64).product()
    }

    pub fn bytes(&self) -> u64 {
        self.numel() * self.dtype.size() as u64
    }

    /// The whole tensor as one side of a send/recv with `peer`, on the defaults.
    pub fn transfer(&self, peer: usize) -> devcomm::p2p::Transfer {
        devcomm::p2p::Transfer {
            ptr: self.ptr,
            bytes: self.bytes(),
            peer,
            config: None,
        }
    }

    /// Row-major contiguity (dimensions of size 1 may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let Some(strides) = &self.strides else {
            return true;
        };
        if strides.len() != self.shape.len() {
            return false;
        }
        let mut expected = 1i64;
        for (&d, &s) in self.shape.iter().zip(strides).rev() {
            if d != 1 && s != expected {
                return self.numel() == 0;
            }
            expected = expected.saturating_mul(d);
        }
        true
    }

    /// Checks what every operation needs: a contiguous tensor on CUDA device `ordinal`, with an
    /// address aligned to its element size. `what` names the argument in the error.
    pub fn check(&self, op: &str, what: &str, ordinal: i64) -> PyResult<()> {
        match &self.device {
            Device::Cuda(d) if *d == ordinal => {}
            Device::CudaUnstated => {}
            Device::Cuda(d) => {
                return Err(invalid(
                    op,
                    format!("{what} is on cuda:{d}; this communicator uses cuda:{ordinal}"),
                ))
            }
            Device::Other(name) => {
                return Err(invalid(
                    op,
                    format!("{what} is on {name}, not on a CUDA device (cuda:{ordinal})"),
                ))
            }
        }
        if !self.is_contiguous() {
            return Err(invalid(
                op,
                format!(
                    "{what} is not contiguous (shape {:?}, strides {:?}); call .contiguous()",
                    self.shape,
                    self.strides.as_deref().unwrap_or(&[])
                ),
            ));
        }
        if self.numel() > 0 {
            if self.ptr == 0 {
                return Err(invalid(op, format!("{what} has a null data pointer")));
            }
            if self.ptr % self.dtype.size() as u64 != 0 {
                return Err(invalid(
                    op,
                    format!(
                        "{what}'s address {:#x} is not aligned to its {}-byte elements",
                        self.ptr,
                        self.dtype.size()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks the dtype against `want`.
    pub fn check_dtype(&self, op: &str, what: &str, want: &[DType]) -> PyResult<()> {
        if want.contains(&self.dtype) {
            return Ok(());
        }
        let names: Vec<&str> = want.iter().map(|d| d.name()).collect();
        Err(invalid(
            op,
            format!(
                "{what} has dtype {}; expected {}",
                self.dtype.name(),
                names.join(" or ")
            ),
        ))
    }
}

/// Reads a tensor description from any of the three forms (see the module's doc). `stream` is
/// passed to `__dlpack__` so that a producer orders its pending work before ours.
pub fn describe(op: &str, what: &str, obj: &Bound<'_, PyAny>, stream: u64) -> PyResult<TensorDesc> {
    if let Ok(t) = obj.cast::<PyTuple>() {
        return from_tuple(op, what, t);
    }
    let py = obj.py();
    if let Ok(cai) = obj.getattr(pyo3::intern!(py, "__cuda_array_interface__")) {
        return from_cai(op, what, &cai);
    }
    if obj.hasattr(pyo3::intern!(py, "__dlpack__"))? {
        return from_dlpack(op, what, obj, stream);
    }
    let ty = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    Err(invalid(
        op,
        format!(
            "{what} is a {ty}: expected a CUDA tensor (torch.Tensor, an object with \
             __cuda_array_interface__ or __dlpack__)"
        ),
    ))
}

fn from_tuple(op: &str, what: &str, t: &Bound<'_, PyTuple>) -> PyResult<TensorDesc> {
    let bad = |why: &str| invalid(op, format!("{what}: bad tensor description: {why}"));
    if t.len() != 5 {
        return Err(bad("expected (ptr, dtype, shape, strides, device)"));
    }
    let ptr: u64 = t.get_item(0)?.extract().map_err(|_| bad("ptr"))?;
    let name = t.get_item(1)?;
    let name = name.cast::<PyString>().map_err(|_| bad("dtype"))?;
    let name = name.to_str()?;
    let dtype = DType::from_name(name).ok_or_else(|| {
        invalid(
            op,
            format!("{what} has dtype {name}, which devcomm does not move"),
        )
    })?;
    let shape: Vec<i64> = t.get_item(2)?.extract().map_err(|_| bad("shape"))?;
    let strides_obj = t.get_item(3)?;
    let strides: Option<Vec<i64>> = if strides_obj.is_none() {
        None
    } else {
        Some(strides_obj.extract().map_err(|_| bad("strides"))?)
    };
    let dev = t.get_item(4)?;
    let device = match dev.extract::<i64>() {
        Ok(d) if d >= 0 => Device::Cuda(d),
        Ok(_) => Device::Other("cpu".into()),
        Err(_) => Device::Other(dev.str()?.to_string()),
    };
    Ok(TensorDesc {
        ptr,
        dtype,
        shape,
        strides,
        device,
    })
}

fn from_cai(op: &str, what: &str, cai: &Bound<'_, PyAny>) -> PyResult<TensorDesc> {
    let bad = |why: String| invalid(op, format!("{what}: bad __cuda_array_interface__: {why}"));
    let d = cai.cast::<PyDict>().map_err(|_| bad("not a dict".into()))?;
    let item = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        d.get_item(k)?.ok_or_else(|| bad(format!("no `{k}`")))
    };
    let version: i64 = item("version")?
        .extract()
        .map_err(|_| bad("version".into()))?;
    if !(2..=3).contains(&version) {
        return Err(bad(format!("version {version}; 2 or 3 are read")));
    }
    let typestr: String = item("typestr")?
        .extract()
        .map_err(|_| bad("typestr".into()))?;
    let dtype = DType::from_typestr(&typestr).ok_or_else(|| {
        invalid(
            op,
            format!("{what} has typestr {typestr:?}, which devcomm does not move"),
        )
    })?;
    let shape: Vec<i64> = item("shape")?.extract().map_err(|_| bad("shape".into()))?;
    let (ptr, _readonly): (u64, bool) = item("data")?
        .extract()
        .map_err(|_| bad("data must be (ptr, readonly)".into()))?;
    if let Some(mask) = d.get_item("mask")? {
        if !mask.is_none() {
            return Err(invalid(op, format!("{what} is a masked array")));
        }
    }
    let strides = match d.get_item("strides")? {
        Some(s) if !s.is_none() => {
            let bytes: Vec<i64> = s.extract().map_err(|_| bad("strides".into()))?;
            let size = dtype.size() as i64;
            if bytes.iter().any(|b| b % size != 0) {
                return Err(invalid(
                    op,
                    format!("{what} has strides {bytes:?} bytes, not whole {size}-byte elements"),
                ));
            }
            Some(bytes.iter().map(|b| b / size).collect())
        }
        _ => None,
    };
    Ok(TensorDesc {
        ptr,
        dtype,
        shape,
        strides,
        device: Device::CudaUnstated,
    })
}

/// DLPack's C structs (dlpack.h), as far as they are read here.
#[repr(C)]
pub(crate) struct DLDevice {
    pub device_type: i32,
    pub device_id: i32,
}

#[repr(C)]
pub(crate) struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

#[repr(C)]
pub(crate) struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *const i64,
    pub strides: *const i64,
    pub byte_offset: u64,
}

/// `DLManagedTensor`: the tensor first.
#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
}

/// `DLManagedTensorVersioned`: version, manager, deleter and flags before the tensor.
#[repr(C)]
struct DLManagedTensorVersioned {
    version_major: u32,
    version_minor: u32,
    manager_ctx: *mut c_void,
    deleter: *mut c_void,
    flags: u64,
    dl_tensor: DLTensor,
}

const KDL_CPU: i32 = 1;
pub(crate) const KDL_CUDA: i32 = 2;
const KDL_CUDA_HOST: i32 = 3;
const KDL_CUDA_MANAGED: i32 = 13;

fn device_name(device_type: i32) -> String {
    match device_type {
        KDL_CPU => "cpu".into(),
        KDL_CUDA_HOST => "CUDA pinned host memory".into(),
        KDL_CUDA_MANAGED => "CUDA managed memory".into(),
        other => format!("DLPack device type {other}"),
    }
}

fn from_dlpack(op: &str, what: &str, obj: &Bound<'_, PyAny>, stream: u64) -> PyResult<TensorDesc> {
    let py = obj.py();
    if let Ok(dev) = obj.call_method0(pyo3::intern!(py, "__dlpack_device__")) {
        let (ty, _id): (i32, i64) = dev
            .extract()
            .map_err(|_| invalid(op, format!("{what}: __dlpack_device__ is not (type, id)")))?;
        if ty != KDL_CUDA {
            return Err(invalid(
                op,
                format!("{what} is on {}, not on a CUDA device", device_name(ty)),
            ));
        }
    }
    // DLPack's stream numbers: 1 is the legacy default stream (0 is ambiguous there).
    let kw = pyo3::types::PyDict::new(py);
    kw.set_item("stream", if stream == 0 { 1 } else { stream })?;
    let capsule = obj.call_method(pyo3::intern!(py, "__dlpack__"), (), Some(&kw))?;
    let ptr = capsule.as_ptr();
    // SAFETY: `ptr` is a live object (held by `capsule`); PyCapsule_CheckExact only reads its
    // type.
    if unsafe { pyo3::ffi::PyCapsule_CheckExact(ptr) } == 0 {
        return Err(invalid(
            op,
            format!("{what}.__dlpack__() did not return a capsule"),
        ));
    }
    // SAFETY: `ptr` is a capsule (checked above); the returned name, if any, lives as long as
    // the capsule, which `capsule` keeps alive for this function.
    let name = unsafe { pyo3::ffi::PyCapsule_GetName(ptr) };
    if name.is_null() {
        // SAFETY: clears the exception PyCapsule_GetName may have set; the GIL is held.
        unsafe { pyo3::ffi::PyErr_Clear() };
        return Err(invalid(
            op,
            format!("{what}: a DLPack capsule without a name"),
        ));
    }
    // SAFETY: non-null, NUL-terminated (a capsule's name is a C string).
    let name = unsafe { CStr::from_ptr(name) };
    let versioned = match name.to_bytes() {
        b"dltensor" => false,
        b"dltensor_versioned" => true,
        other => {
            return Err(invalid(
                op,
                format!(
                    "{what}: a capsule named {:?} is not an unconsumed DLPack tensor",
                    String::from_utf8_lossy(other)
                ),
            ))
        }
    };
    // SAFETY: `name` is the capsule's own name, so GetPointer cannot fail on a name mismatch.
    let raw = unsafe { pyo3::ffi::PyCapsule_GetPointer(ptr, name.as_ptr()) };
    if raw.is_null() {
        // SAFETY: clears the exception that may have been set; the GIL is held.
        unsafe { pyo3::ffi::PyErr_Clear() };
        return Err(invalid(
            op,
            format!("{what}: a DLPack capsule with a null pointer"),
        ));
    }
    let t: &DLTensor = if versioned {
        // SAFETY: a `dltensor_versioned` capsule holds a DLManagedTensorVersioned (DLPack
        // 1.x), alive until the capsule is destroyed; `capsule` outlives this borrow.
        let m = unsafe { &*(raw as *const DLManagedTensorVersioned) };
        if m.version_major != 1 {
            return Err(invalid(
                op,
                format!(
                    "{what}: DLPack version {}.{}; 1.x is read",
                    m.version_major, m.version_minor
                ),
            ));
        }
        &m.dl_tensor
    } else {
        // SAFETY: a `dltensor` capsule holds a DLManagedTensor, alive until the capsule is
        // destroyed; `capsule` outlives this borrow.
        unsafe { &(*(raw as *const DLManagedTensor)).dl_tensor }
    };
    if t.device.device_type != KDL_CUDA {
        return Err(invalid(
            op,
            format!(
                "{what} is on {}, not on a CUDA device",
                device_name(t.device.device_type)
            ),
        ));
    }
    if !(0..=64).contains(&t.ndim) || (t.ndim > 0 && t.shape.is_null()) {
        return Err(invalid(
            op,
            format!("{what}: DLPack tensor with ndim {}", t.ndim),
        ));
    }
    let dtype = DType::from_dlpack(t.dtype.code, t.dtype.bits, t.dtype.lanes).ok_or_else(|| {
        invalid(
            op,
            format!(
                "{what} has DLPack dtype (code {}, bits {}, lanes {}), which devcomm does not move",
                t.dtype.code, t.dtype.bits, t.dtype.lanes
            ),
        )
    })?;
    let n = t.ndim as usize;
    let shape = if n == 0 {
        Vec::new()
    } else {
        // SAFETY: DLPack's contract: `shape` points at `ndim` int64s (non-null, checked).
        unsafe { std::slice::from_raw_parts(t.shape, n) }.to_vec()
    };
    let strides = if t.strides.is_null() || n == 0 {
        None
    } else {
        // SAFETY: DLPack's contract: non-null `strides` points at `ndim` int64s (elements).
        Some(unsafe { std::slice::from_raw_parts(t.strides, n) }.to_vec())
    };
    Ok(TensorDesc {
        ptr: (t.data as u64).wrapping_add(t.byte_offset),
        dtype,
        shape,
        strides,
        device: Device::Cuda(t.device.device_id as i64),
    })
}
