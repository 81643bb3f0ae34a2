//! [`Hooks`]: the user's `produce`/`consume` CUDA C++ pair, typed by the element types it
//! reads and writes, the built-in copy hooks, and the collective kernel's spec for a pair (public through
//! `crate::kernels::kernel_spec`);
//! [`RawHooks`]: the same without the types, for callers that know element sizes only at run
//! time (bindings), checked against the buffers at each call.

use std::borrow::Cow;
use std::marker::PhantomData;

use super::THREADS;
use crate::error::{Error, Result};
use crate::jit::KernelSpec;

/// The collective kernel's source (`cuda/kernels/collective.cu`), appended to the hooks'.
const KERNEL_SOURCE: &str = include_str!("../../cuda/kernels/collective.cu");

/// A pair of hooks, `produce(ctx) -> tile` and `consume(ctx, tile)`, given as CUDA C++ source
/// (see `cuda/devcomm/hooks.cuh` for the contract and the `Ctx` struct). The JIT compiles the
/// source into the collective kernel; a compile error comes back as [`Error::Compile`] with
/// NVRTC's message.
///
/// ```text
/// struct Scale2 {
///   using In = float; using Out = float; using Wire = float;
///   static __device__ devcomm::Tile<float> produce(const devcomm::Ctx& c) {
///     auto t = devcomm::load_tile<float>(c);
///     for (float& x : t.v) x *= 2.0f;
///     return t;
///   }
///   static __device__ void consume(const devcomm::Ctx& c, const devcomm::Tile<float>& t) {
///     devcomm::store_tile<float>(c, t);
///   }
/// };
/// ```
///
/// `I` and `O` are the element types of the buffers the hooks read and write; a call takes
/// buffers of exactly those types, so a mismatch is a compile error:
///
/// ```no_run
/// # fn f(comm: &devcomm::Comm, s: &cudarc::driver::CudaSlice<f32>,
/// #      r: &mut cudarc::driver::CudaSlice<f32>, st: &std::sync::Arc<cudarc::driver::CudaStream>) {
/// let hooks = devcomm::Hooks::<f32>::copy();
/// comm.all_to_all_hooked(&hooks, s, r, devcomm::HookArgs::default(), st).unwrap();
/// # }
/// ```
///
/// ```compile_fail
/// # fn f(comm: &devcomm::Comm, s: &cudarc::driver::CudaSlice<f32>,
/// #      r: &mut cudarc::driver::CudaSlice<u16>, st: &std::sync::Arc<cudarc::driver::CudaStream>) {
/// let hooks = devcomm::Hooks::<f32>::copy();
/// comm.all_to_all_hooked(&hooks, s, r, devcomm::HookArgs::default(), st); // u16 output: error
/// # }
/// ```
pub struct Hooks<I, O = I> {
    raw: RawHooks,
    _elems: PhantomData<fn(I) -> O>,
}

impl<I, O> Clone for Hooks<I, O> {
    fn clone(&self) -> Self {
        Self {
            raw: self.raw.clone(),
            _elems: PhantomData,
        }
    }
}

impl<I, O> std::fmt::Debug for Hooks<I, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("name", &self.raw.name)
            .field("in", &std::any::type_name::<I>())
            .field("out", &std::any::type_name::<O>())
            .finish()
    }
}

impl<T> Hooks<T> {
    /// The default hooks: copy elements of `T`, whose size must be 1, 2, 4, 8 or 16 bytes.
    /// The size is checked when the call is compiled:
    ///
    /// ```compile_fail
    /// let hooks = devcomm::Hooks::<[u8; 3]>::copy(); // 3 bytes: a compile error
    /// ```
    pub fn copy() -> Self {
        const {
            assert!(
                matches!(std::mem::size_of::<T>(), 1 | 2 | 4 | 8 | 16),
                "Hooks::copy: the element size must be 1, 2, 4, 8 or 16 bytes (use a byte view \
                 of the buffer)"
            )
        };
        Self::typed(RawHooks::copy_of_size(std::mem::size_of::<T>()))
    }
}

impl<I, O> Hooks<I, O> {
    fn typed(raw: RawHooks) -> Self {
        Self {
            raw,
            _elems: PhantomData,
        }
    }

    /// User hooks: `name` is the struct defined in `source`, whose `In` and `Out` types must be
    /// as large as `I` and `O` (checked when the kernel compiles).
    pub fn new(name: impl Into<String>, source: impl Into<String>) -> Self {
        Self::typed(RawHooks::build(
            Cow::Owned(name.into()),
            Cow::Owned(source.into()),
            std::mem::size_of::<I>(),
            std::mem::size_of::<O>(),
        ))
    }

    /// The hooks without their element types (what the raw forms and the JIT take).
    pub fn raw(&self) -> &RawHooks {
        &self.raw
    }

    /// The hooks struct's name.
    pub fn name(&self) -> &str {
        self.raw.name()
    }
}

impl<I, O> From<Hooks<I, O>> for RawHooks {
    fn from(h: Hooks<I, O>) -> Self {
        h.raw
    }
}

/// [`Hooks`] without element types: sizes in bytes, checked against the buffers of each call
/// (the raw forms of the operations, bindings that know element types only at run time).
/// Made by [`crate::raw::copy_hooks`], [`crate::raw::hooks_with_sizes`] or [`Hooks::raw`].
#[derive(Debug, Clone)]
pub struct RawHooks {
    name: Cow<'static, str>,
    source: Cow<'static, str>,
    pub(super) in_size: usize,
    out_size: usize,
    /// Hash of everything above: the key of the loaded-kernel cache (no copy per launch).
    pub(super) key: u64,
}

/// The copy hooks by element size, 1 to 16 bytes (index: log2 of the size).
const COPY_HOOKS: [&str; 5] = [
    "devcomm::CopyHooks<devcomm::Bytes1>",
    "devcomm::CopyHooks<devcomm::Bytes2>",
    "devcomm::CopyHooks<devcomm::Bytes4>",
    "devcomm::CopyHooks<devcomm::Bytes8>",
    "devcomm::CopyHooks<devcomm::Bytes16>",
];

impl RawHooks {
    pub(crate) fn build(
        name: Cow<'static, str>,
        source: Cow<'static, str>,
        in_size: usize,
        out_size: usize,
    ) -> Self {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&name, &source, in_size, out_size).hash(&mut h);
        Self {
            name,
            source,
            in_size,
            out_size,
            key: h.finish(),
        }
    }

    /// The copy hooks for elements of `size` bytes, a power of two from 1 to 16 (checked by
    /// the callers).
    pub(crate) fn copy_of_size(size: usize) -> Self {
        debug_assert!(matches!(size, 1 | 2 | 4 | 8 | 16));
        let name = COPY_HOOKS[size.trailing_zeros() as usize];
        Self::build(name.into(), "".into(), size, size)
    }

    /// Whether these are the built-in copy hooks ([`Hooks::copy`]): the wire carries the
    /// input's bytes.
    pub(crate) fn is_copy(&self) -> bool {
        self.source.is_empty()
    }

    /// Bytes of the input and output elements.
    pub(crate) fn elem_sizes(&self) -> (usize, usize) {
        (self.in_size, self.out_size)
    }

    /// Checks that these hooks were declared for the buffers' element sizes (`None`: that
    /// side is not used by the call).
    pub(crate) fn check_sizes(
        &self,
        op: &'static str,
        input: Option<usize>,
        output: Option<usize>,
    ) -> Result<()> {
        let fits = |want: Option<usize>, have: usize| want.is_none_or(|w| w == have);
        if fits(input, self.in_size) && fits(output, self.out_size) {
            return Ok(());
        }
        Err(Error::InvalidArgument {
            op,
            reason: format!(
                "hooks `{}` were declared for elements of {} and {} bytes, the buffers' are \
                 {input:?} and {output:?}",
                self.name, self.in_size, self.out_size
            ),
        })
    }

    /// The hooks struct's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The hooks' CUDA C++ source (empty for the built-in copy hooks).
    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// Hash of name, source and sizes: the key of loaded-kernel caches.
    pub(crate) fn key(&self) -> u64 {
        self.key
    }

    /// The kernel's name expression: `mixed` peer tuning classes; `net`: some peer is reached
    /// over the network (its roles take the network path).
    pub(crate) fn expression(&self, mixed: bool, net: bool) -> String {
        format!(
            "devcomm::coll::coll_kernel<{}, {THREADS}, {mixed}, {net}>",
            self.name
        )
    }

    /// The kernel spec: the collective header, the user's source, checks of the element sizes,
    /// the kernel (`cuda/kernels/collective.cu`), and both instantiations for NVLink peers (uniform and mixed peer tuning); `net`: also
    /// the instantiation for network peers (docs/NETWORK.md; only a communicator with network
    /// links compiles it, since it adds half again to the compile time). Without the
    /// configuration's options: `crate::kernels::kernel_spec` adds `DEVCOMM_COLL_OPTIONS`.
    pub(crate) fn spec(&self, net: bool) -> KernelSpec {
        let source = format!(
            "#include \"devcomm/collective.cuh\"\n#line 1 \"hooks.cu\"\n{src}\n#line 1 \"devcomm-checks\"\n\
             static_assert(sizeof({name}::In) == {i}, \"the hooks' In type is not the size of the \
             send buffer's elements ({i} bytes)\");\n\
             static_assert(sizeof({name}::Out) == {o}, \"the hooks' Out type is not the size of the \
             receive buffer's elements ({o} bytes)\");\n#line 1 \"collective.cu\"\n{kernel}",
            src = self.source,
            kernel = KERNEL_SOURCE,
            name = self.name,
            i = self.in_size,
            o = self.out_size,
        );
        let mut spec = KernelSpec::new("collective", source)
            .name_expression(self.expression(false, false))
            .name_expression(self.expression(true, false));
        if net {
            spec = spec.name_expression(self.expression(true, true));
        }
        spec
    }
}
