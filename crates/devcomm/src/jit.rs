//! Layer 6: run-time compilation of kernels with NVRTC, and an on-disk cubin cache.
//!
//! A [`KernelSpec`] is a translation unit (usually a small one that includes
//! `devcomm/devcomm.cuh` and instantiates templates with compile-time values), the name
//! expressions of the kernels to fetch, and extra NVRTC options. [`compile`] turns it into a
//! cubin for one exact architecture without needing a GPU; every header of [`crate::device`] is
//! given to NVRTC in memory. [`Jit`] adds a disk cache shared by all processes of the machine
//! (content-addressed, written atomically) and an in-process memo of loaded modules.
//!
//! Compile errors come back as [`Error::Compile`] with NVRTC's log; the program is named
//! `{spec.name}.cu`, so the log's line numbers point into the user's own source.
//!
//! Environment:
//! - `DEVCOMM_CACHE_DIR`: cache directory (default `$HOME/.cache/devcomm/kernels`).
//! - `DEVCOMM_DUMP_DIR`: when set, every compile writes `{name}.cu`, `{name}.ptx`,
//!   `{name}.cubin` (disassemble with `cuobjdump -sass`), `{name}.names.txt` and `{name}.log`
//!   there, and [`Jit`] skips cache reads so that the dump is always produced.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_int, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{sys, Ptx};
use sha2::{Digest, Sha256};

use crate::error::{CudaResultExt, Error, Result};

/// Options every compile gets, before the spec's own.
const DEFAULT_OPTIONS: &[&str] = &["-std=c++17", "-default-device"];

/// Version tag of the cache format; bump when the stored files change meaning.
const CACHE_FORMAT: &str = "devcomm-jit-cache-v1";

/// What to compile: one translation unit and the kernels to fetch from it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelSpec {
    /// Kernel (module) name; the NVRTC program is `{name}.cu` and compile errors name it.
    pub name: String,
    /// CUDA C++ source. May include any header of [`crate::device::HEADERS`] by its name.
    pub source: String,
    /// Expressions naming the kernels to fetch, e.g. `"put_signal_all"` (extern "C") or
    /// `"devcomm::send_kernel<float, 4>"` (templates); NVRTC instantiates and lowers them.
    pub name_expressions: Vec<String>,
    /// Extra NVRTC options, e.g. `-DCHUNK=65536` or `-lineinfo`.
    pub options: Vec<String>,
}

impl KernelSpec {
    /// A spec with no name expressions and no extra options.
    pub fn new(name: impl Into<String>, source: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            source: source.into(),
            name_expressions: Vec::new(),
            options: Vec::new(),
        }
    }

    /// Adds a name expression.
    pub fn name_expression(mut self, expression: impl Into<String>) -> Self {
        self.name_expressions.push(expression.into());
        self
    }

    /// Adds an NVRTC option.
    pub fn option(mut self, option: impl Into<String>) -> Self {
        self.options.push(option.into());
        self
    }

    /// The foundation's test and benchmark kernels ([`crate::device::FOUNDATION_SOURCE`]).
    pub fn foundation() -> Self {
        let mut spec = Self::new(
            crate::device::FOUNDATION_NAME,
            crate::device::FOUNDATION_SOURCE,
        );
        spec.name_expressions = crate::device::FOUNDATION_KERNELS
            .iter()
            .map(|k| k.to_string())
            .collect();
        spec
    }
}

/// The result of a compile: a cubin for one architecture and the kernels' lowered names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledModule {
    /// The cubin (ELF), loadable with `cuModuleLoadData` on a GPU of the compiled architecture.
    pub cubin: Vec<u8>,
    /// Name expression -> lowered (mangled) symbol name.
    pub lowered_names: BTreeMap<String, String>,
    /// NVRTC's log (warnings); empty when it had nothing to say.
    pub log: String,
}

/// Whether [`Jit::compile_cached`] found the module in the disk cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Read from the disk cache; NVRTC was not called.
    Hit,
    /// Compiled now (and stored, if the cache directory is writable).
    Compiled,
}

/// Compiles `spec` for compute capability `arch` = `(major, minor)`, e.g. `(9, 0)` for sm_90.
/// Needs NVRTC but no GPU. Returns [`Error::Compile`] with NVRTC's log if the source does not
/// compile, [`Error::Nvrtc`] if NVRTC is missing or fails otherwise.
pub fn compile(spec: &KernelSpec, arch: (u32, u32)) -> Result<CompiledModule> {
    ensure_nvrtc()?;
    let options = all_options(spec, arch);
    let program = Program::create(spec)?;
    for expression in &spec.name_expressions {
        program.add_name_expression(expression)?;
    }
    let compiled = program.compile(&options);
    let log = program.log()?;
    match compiled {
        Ok(()) => {}
        Err(sys::nvrtcResult::NVRTC_ERROR_COMPILATION) => {
            dump_failed(spec, &log)?;
            return Err(Error::Compile {
                kernel: spec.name.clone(),
                log,
            });
        }
        Err(code) => {
            return Err(nvrtc_error(
                "nvrtcCompileProgram",
                code,
                format!("options {options:?}; log:\n{log}"),
            ))
        }
    }
    let cubin = program.cubin()?;
    let mut lowered_names = BTreeMap::new();
    for expression in &spec.name_expressions {
        lowered_names.insert(expression.clone(), program.lowered_name(expression)?);
    }
    let module = CompiledModule {
        cubin,
        lowered_names,
        log,
    };
    if let Some(dir) = dump_dir() {
        dump(&dir, spec, &program, &module)?;
    }
    Ok(module)
}

/// NVRTC's version as `(major, minor)`; part of every cache key.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    static VERSION: OnceLock<(i32, i32)> = OnceLock::new();
    if let Some(version) = VERSION.get() {
        return Ok(*version);
    }
    ensure_nvrtc()?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: NVRTC is loaded (checked above); both pointers are valid for writes.
    let rc = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    check(rc, "nvrtcVersion")?;
    Ok(*VERSION.get_or_init(|| (major, minor)))
}

/// The disk-cache key of `spec` for `arch`: hex SHA-256 of the source, the name expressions,
/// every embedded header, the options (defaults included), the architecture and NVRTC's version.
pub fn cache_key(spec: &KernelSpec, arch: (u32, u32)) -> Result<String> {
    let (nvrtc_major, nvrtc_minor) = nvrtc_version()?;
    let mut hasher = Sha256::new();
    // Every field is length-prefixed so that no two different specs hash the same byte stream.
    let mut field = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    field(CACHE_FORMAT.as_bytes());
    field(spec.name.as_bytes());
    field(spec.source.as_bytes());
    for expression in &spec.name_expressions {
        field(expression.as_bytes());
    }
    field(&headers_digest());
    for option in all_options(spec, arch) {
        field(option.as_bytes());
    }
    field(format!("nvrtc {nvrtc_major}.{nvrtc_minor}").as_bytes());
    Ok(hex(&hasher.finalize()))
}

/// The JIT: compiles through a disk cache and memoises loaded modules per device.
///
/// Share one `Jit` per process (e.g. in the communicator); [`Jit::load`] of the same spec on the
/// same device then returns the same module without touching disk or NVRTC.
#[derive(Debug)]
pub struct Jit {
    cache_dir: PathBuf,
    memo: Mutex<HashMap<(usize, String), Arc<LoadedModule>>>,
}

impl Default for Jit {
    fn default() -> Self {
        Self::new()
    }
}

impl Jit {
    /// A JIT caching in `DEVCOMM_CACHE_DIR`, else `$HOME/.cache/devcomm/kernels`, else a
    /// `devcomm-kernels` directory in the system's temporary directory. The directory is
    /// created on the first store.
    pub fn new() -> Self {
        let cache_dir = match (
            std::env::var_os("DEVCOMM_CACHE_DIR"),
            std::env::var_os("HOME"),
        ) {
            (Some(dir), _) if !dir.is_empty() => PathBuf::from(dir),
            (_, Some(home)) if !home.is_empty() => {
                PathBuf::from(home).join(".cache/devcomm/kernels")
            }
            _ => std::env::temp_dir().join("devcomm-kernels"),
        };
        Self::with_cache_dir(cache_dir)
    }

    /// A JIT caching in `dir`.
    pub fn with_cache_dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            cache_dir: dir.into(),
            memo: Mutex::new(HashMap::new()),
        }
    }

    /// The cache directory.
    pub fn cache_dir(&self) -> &Path {
        &self.cache_dir
    }

    /// Compiles `spec` for `arch` through the disk cache. A damaged or unwritable cache only
    /// costs a compile (it is logged, not returned as an error).
    pub fn compile_cached(
        &self,
        spec: &KernelSpec,
        arch: (u32, u32),
    ) -> Result<(CompiledModule, CacheOutcome)> {
        let key = cache_key(spec, arch)?;
        if dump_dir().is_none() {
            if let Some(module) = self.read_cache(&key, spec) {
                return Ok((module, CacheOutcome::Hit));
            }
        }
        let module = compile(spec, arch)?;
        if let Err(err) = self.write_cache(&key, &module) {
            log::warn!(
                "kernel `{}`: not cached in {}: {err}",
                spec.name,
                self.cache_dir.display()
            );
        }
        Ok((module, CacheOutcome::Compiled))
    }

    /// Compiles (or fetches from cache) `spec` for the GPU of `ctx` and loads it there. Repeated
    /// loads of the same spec on the same device return the same module.
    pub fn load(&self, ctx: &Arc<CudaContext>, spec: &KernelSpec) -> Result<Arc<LoadedModule>> {
        let (major, minor) = ctx
            .compute_capability()
            .cuda(-1, "cuDeviceGetAttribute(COMPUTE_CAPABILITY)")?;
        let arch = (major as u32, minor as u32);
        let memo_key = (ctx.ordinal(), cache_key(spec, arch)?);
        if let Some(module) = self.memo().get(&memo_key) {
            return Ok(module.clone());
        }
        // Not holding the lock while compiling: two threads may compile the same spec at once,
        // which costs time but is correct (the first insert wins below).
        let (compiled, _) = self.compile_cached(spec, arch)?;
        let module = ctx
            .load_module(Ptx::from_binary(compiled.cubin))
            .cuda(-1, "cuModuleLoadData")?;
        let loaded = Arc::new(LoadedModule {
            name: spec.name.clone(),
            module,
            lowered_names: compiled.lowered_names,
        });
        Ok(self.memo().entry(memo_key).or_insert(loaded).clone())
    }

    fn memo(&self) -> std::sync::MutexGuard<'_, HashMap<(usize, String), Arc<LoadedModule>>> {
        // A panic while holding the lock cannot leave the map half-updated (single insert).
        self.memo
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn read_cache(&self, key: &str, spec: &KernelSpec) -> Option<CompiledModule> {
        let cubin = std::fs::read(self.cache_dir.join(format!("{key}.cubin"))).ok()?;
        let meta = std::fs::read(self.cache_dir.join(format!("{key}.json"))).ok()?;
        let meta: CacheMeta = match serde_json::from_slice(&meta) {
            Ok(meta) => meta,
            Err(err) => {
                log::warn!("kernel `{}`: damaged cache entry {key}: {err}", spec.name);
                return None;
            }
        };
        let complete = spec
            .name_expressions
            .iter()
            .all(|e| meta.lowered_names.contains_key(e));
        (complete && !cubin.is_empty()).then_some(CompiledModule {
            cubin,
            lowered_names: meta.lowered_names,
            log: meta.log,
        })
    }

    fn write_cache(&self, key: &str, module: &CompiledModule) -> Result<()> {
        std::fs::create_dir_all(&self.cache_dir).map_err(|source| Error::Io {
            context: format!("creating kernel cache {}", self.cache_dir.display()),
            source,
        })?;
        let meta = CacheMeta {
            lowered_names: module.lowered_names.clone(),
            log: module.log.clone(),
        };
        // serde_json cannot fail on a map of strings.
        let meta = serde_json::to_vec_pretty(&meta).unwrap_or_default();
        // Readers need both files; each appears atomically, so a reader sees a whole file or
        // none, and a missing one is just a miss (and a rewrite of identical content).
        write_atomic(&self.cache_dir, &format!("{key}.cubin"), &module.cubin)?;
        write_atomic(&self.cache_dir, &format!("{key}.json"), &meta)
    }
}

/// A module loaded on one device, with the lowered names of its kernels.
#[derive(Debug)]
pub struct LoadedModule {
    name: String,
    module: Arc<CudaModule>,
    lowered_names: BTreeMap<String, String>,
}

impl LoadedModule {
    /// The kernel that `name_expression` named in the spec. An expression that was not in the
    /// spec is looked up as a plain symbol (right for `extern "C"` kernels).
    pub fn function(&self, name_expression: &str) -> Result<CudaFunction> {
        let symbol = self
            .lowered_names
            .get(name_expression)
            .map_or(name_expression, String::as_str);
        if symbol.contains('\0') {
            return Err(Error::InvalidArgument {
                op: "LoadedModule::function",
                reason: format!("kernel name {symbol:?} contains a NUL byte"),
            });
        }
        self.module
            .load_function(symbol)
            .cuda(-1, "cuModuleGetFunction")
            .inspect_err(|_| log::debug!("module `{}` has no kernel `{symbol}`", self.name))
    }

    /// Loads the code of every kernel of the spec now rather than at its first launch (the
    /// driver's lazy loading), which can wait for kernels already running on the device.
    pub fn load_every_kernel(&self) -> Result<()> {
        for expression in self.lowered_names.keys() {
            let f = self.function(expression)?;
            // SAFETY: a function handle of this loaded module, alive as long as `self`.
            unsafe { cudarc::driver::sys::cuFuncLoad(f.cu_function()) }
                .result()
                .cuda(-1, "cuFuncLoad")?;
        }
        Ok(())
    }

    /// The underlying cudarc module.
    pub fn module(&self) -> &Arc<CudaModule> {
        &self.module
    }

    /// Name expression -> lowered symbol name, for every expression of the spec.
    pub fn lowered_names(&self) -> &BTreeMap<String, String> {
        &self.lowered_names
    }
}

/// The JSON sidecar of a cached cubin.
#[derive(serde::Serialize, serde::Deserialize)]
struct CacheMeta {
    lowered_names: BTreeMap<String, String>,
    log: String,
}

/// An NVRTC program, destroyed on drop. Holds the C strings NVRTC may keep pointers to.
struct Program {
    handle: sys::nvrtcProgram,
    _source: CString,
    _name: CString,
    _headers: Vec<CString>,
    _include_names: Vec<CString>,
}

impl Program {
    fn create(spec: &KernelSpec) -> Result<Self> {
        let source = c_string(&spec.source, "kernel source")?;
        let name = c_string(&format!("{}.cu", spec.name), "kernel name")?;
        let headers = crate::device::HEADERS
            .iter()
            .map(|(_, text)| c_string(text, "header"))
            .collect::<Result<Vec<_>>>()?;
        let include_names = crate::device::HEADERS
            .iter()
            .map(|(include, _)| c_string(include, "header name"))
            .collect::<Result<Vec<_>>>()?;
        let header_ptrs: Vec<*const c_char> = headers.iter().map(|h| h.as_ptr()).collect();
        let include_ptrs: Vec<*const c_char> = include_names.iter().map(|h| h.as_ptr()).collect();
        let mut handle: sys::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: NVRTC is loaded (callers run ensure_nvrtc); every pointer is a NUL-terminated
        // string owned by the returned Program, which outlives the handle; both arrays have
        // HEADERS.len() entries.
        let rc = unsafe {
            sys::nvrtcCreateProgram(
                &mut handle,
                source.as_ptr(),
                name.as_ptr(),
                header_ptrs.len() as c_int,
                header_ptrs.as_ptr(),
                include_ptrs.as_ptr(),
            )
        };
        check(rc, "nvrtcCreateProgram")?;
        Ok(Self {
            handle,
            _source: source,
            _name: name,
            _headers: headers,
            _include_names: include_names,
        })
    }

    fn add_name_expression(&self, expression: &str) -> Result<()> {
        let expression = c_string(expression, "name expression")?;
        // SAFETY: the handle is live; NVRTC copies the expression.
        let rc = unsafe { sys::nvrtcAddNameExpression(self.handle, expression.as_ptr()) };
        check(rc, "nvrtcAddNameExpression")
    }

    /// Compiles; the error is NVRTC's code so that callers can tell compile errors apart.
    fn compile(&self, options: &[String]) -> std::result::Result<(), sys::nvrtcResult> {
        let options: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()).unwrap_or_default())
            .collect();
        let ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: the handle is live; `ptrs` holds ptrs.len() valid C strings during the call.
        let rc =
            unsafe { sys::nvrtcCompileProgram(self.handle, ptrs.len() as c_int, ptrs.as_ptr()) };
        match rc {
            sys::nvrtcResult::NVRTC_SUCCESS => Ok(()),
            code => Err(code),
        }
    }

    fn log(&self) -> Result<String> {
        let mut size = 0usize;
        // SAFETY: the handle is live; `size` is valid for writes.
        let rc = unsafe { sys::nvrtcGetProgramLogSize(self.handle, &mut size) };
        check(rc, "nvrtcGetProgramLogSize")?;
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: `buf` has the `size` bytes NVRTC asked for (at least 1).
        let rc = unsafe { sys::nvrtcGetProgramLog(self.handle, buf.as_mut_ptr().cast()) };
        check(rc, "nvrtcGetProgramLog")?;
        Ok(c_buffer_to_string(buf).trim_end().to_string())
    }

    fn cubin(&self) -> Result<Vec<u8>> {
        let mut size = 0usize;
        // SAFETY: the handle is live and compiled; `size` is valid for writes.
        let rc = unsafe { sys::nvrtcGetCUBINSize(self.handle, &mut size) };
        check(rc, "nvrtcGetCUBINSize")?;
        if size == 0 {
            return Err(Error::Nvrtc {
                call: "nvrtcGetCUBIN",
                message: "NVRTC produced no cubin (was a virtual compute_ architecture given?)"
                    .into(),
            });
        }
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` has the `size` bytes NVRTC asked for.
        let rc = unsafe { sys::nvrtcGetCUBIN(self.handle, cubin.as_mut_ptr().cast()) };
        check(rc, "nvrtcGetCUBIN")?;
        Ok(cubin)
    }

    /// The PTX, if NVRTC kept it for this compile (it does not always for sm_ targets).
    fn ptx(&self) -> Option<String> {
        let mut size = 0usize;
        // SAFETY: the handle is live and compiled; `size` is valid for writes.
        let rc = unsafe { sys::nvrtcGetPTXSize(self.handle, &mut size) };
        if rc != sys::nvrtcResult::NVRTC_SUCCESS || size <= 1 {
            return None;
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` has the `size` bytes NVRTC asked for.
        let rc = unsafe { sys::nvrtcGetPTX(self.handle, buf.as_mut_ptr().cast()) };
        (rc == sys::nvrtcResult::NVRTC_SUCCESS).then(|| c_buffer_to_string(buf))
    }

    fn lowered_name(&self, expression: &str) -> Result<String> {
        let expression_c = c_string(expression, "name expression")?;
        let mut lowered: *const c_char = std::ptr::null();
        // SAFETY: the handle is live and compiled, the expression was added before compiling;
        // NVRTC writes a pointer to a string it owns until the program is destroyed.
        let rc =
            unsafe { sys::nvrtcGetLoweredName(self.handle, expression_c.as_ptr(), &mut lowered) };
        check(rc, "nvrtcGetLoweredName")?;
        if lowered.is_null() {
            return Err(Error::Nvrtc {
                call: "nvrtcGetLoweredName",
                message: format!("no lowered name for `{expression}`"),
            });
        }
        // SAFETY: non-null, NUL-terminated, alive until the program is destroyed (after this).
        Ok(unsafe { CStr::from_ptr(lowered) }
            .to_string_lossy()
            .into_owned())
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the handle came from nvrtcCreateProgram and is destroyed exactly once.
        let rc = unsafe { sys::nvrtcDestroyProgram(&mut self.handle) };
        if rc != sys::nvrtcResult::NVRTC_SUCCESS {
            log::warn!("nvrtcDestroyProgram failed: {rc:?}");
        }
    }
}

/// Fails with a clear error instead of cudarc's panic when libnvrtc cannot be loaded.
fn ensure_nvrtc() -> Result<()> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: loading libnvrtc runs only its own initialisers, which have no preconditions.
    let present = *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() });
    if present {
        Ok(())
    } else {
        Err(Error::Nvrtc {
            call: "dlopen(libnvrtc)",
            message: "the NVRTC library (libnvrtc.so) was not found; install the CUDA NVRTC \
                      runtime (e.g. the nvidia-cuda-nvrtc wheel or the CUDA toolkit) and put its \
                      lib directory on LD_LIBRARY_PATH"
                .into(),
        })
    }
}

fn all_options(spec: &KernelSpec, (major, minor): (u32, u32)) -> Vec<String> {
    let mut options = vec![format!("--gpu-architecture=sm_{major}{minor}")];
    options.extend(DEFAULT_OPTIONS.iter().map(|o| o.to_string()));
    options.extend(spec.options.iter().cloned());
    options
}

/// SHA-256 over every embedded header (name and text), computed once per process.
fn headers_digest() -> [u8; 32] {
    static DIGEST: OnceLock<[u8; 32]> = OnceLock::new();
    *DIGEST.get_or_init(|| {
        let mut hasher = Sha256::new();
        for (name, text) in crate::device::HEADERS {
            for part in [name.as_bytes(), text.as_bytes()] {
                hasher.update((part.len() as u64).to_le_bytes());
                hasher.update(part);
            }
        }
        hasher.finalize().into()
    })
}

fn check(rc: sys::nvrtcResult, call: &'static str) -> Result<()> {
    match rc {
        sys::nvrtcResult::NVRTC_SUCCESS => Ok(()),
        code => Err(nvrtc_error(call, code, String::new())),
    }
}

fn nvrtc_error(call: &'static str, code: sys::nvrtcResult, detail: String) -> Error {
    // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string for every code (NVRTC
    // is loaded: we only get codes from NVRTC calls).
    let text = unsafe { CStr::from_ptr(sys::nvrtcGetErrorString(code)) }.to_string_lossy();
    let message = if detail.is_empty() {
        format!("{code:?} ({text})")
    } else {
        format!("{code:?} ({text}): {detail}")
    };
    Error::Nvrtc { call, message }
}

fn c_string(text: &str, what: &str) -> Result<CString> {
    CString::new(text).map_err(|_| Error::InvalidArgument {
        op: "jit::compile",
        reason: format!("the {what} contains a NUL byte"),
    })
}

fn c_buffer_to_string(mut buf: Vec<u8>) -> String {
    if let Some(end) = buf.iter().position(|&b| b == 0) {
        buf.truncate(end);
    }
    String::from_utf8_lossy(&buf).into_owned()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_atomic(dir: &Path, file_name: &str, bytes: &[u8]) -> Result<()> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    // Unique per process and call, in the same directory so that rename is atomic.
    let tmp = dir.join(format!(".{file_name}.{}.{nanos}.tmp", std::process::id()));
    let io = |context: String| move |source| Error::Io { context, source };
    std::fs::write(&tmp, bytes).map_err(io(format!("writing {}", tmp.display())))?;
    let target = dir.join(file_name);
    std::fs::rename(&tmp, &target).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        Error::Io {
            context: format!("renaming {} to {}", tmp.display(), target.display()),
            source,
        }
    })
}

fn dump_dir() -> Option<PathBuf> {
    std::env::var_os("DEVCOMM_DUMP_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
}

/// Writes the source, PTX, cubin, lowered names and log of a successful compile.
fn dump(dir: &Path, spec: &KernelSpec, program: &Program, module: &CompiledModule) -> Result<()> {
    let io = |context: String| move |source| Error::Io { context, source };
    std::fs::create_dir_all(dir).map_err(io(format!("creating dump dir {}", dir.display())))?;
    let ptx = program.ptx().unwrap_or_else(|| {
        "// NVRTC kept no PTX for this sm_ compile; see the .cubin (cuobjdump -sass)\n".into()
    });
    let names: String = module
        .lowered_names
        .iter()
        .map(|(expression, lowered)| format!("{expression}\t{lowered}\n"))
        .collect();
    let files: [(&str, &[u8]); 5] = [
        ("cu", spec.source.as_bytes()),
        ("ptx", ptx.as_bytes()),
        ("cubin", &module.cubin),
        ("names.txt", names.as_bytes()),
        ("log", module.log.as_bytes()),
    ];
    for (ext, bytes) in files {
        let path = dir.join(format!("{}.{ext}", spec.name));
        std::fs::write(&path, bytes).map_err(io(format!("dumping {}", path.display())))?;
    }
    Ok(())
}

/// On a compile error, dumps the source and log (if dumping is on) so the failure can be replayed.
fn dump_failed(spec: &KernelSpec, log: &str) -> Result<()> {
    let Some(dir) = dump_dir() else {
        return Ok(());
    };
    let io = |context: String| move |source| Error::Io { context, source };
    std::fs::create_dir_all(&dir).map_err(io(format!("creating dump dir {}", dir.display())))?;
    for (ext, bytes) in [("cu", spec.source.as_bytes()), ("log", log.as_bytes())] {
        let path = dir.join(format!("{}.{ext}", spec.name));
        std::fs::write(&path, bytes).map_err(io(format!("dumping {}", path.display())))?;
    }
    Ok(())
}

/// Extra NVRTC options from the environment variable `var`, split at whitespace (none when it
/// is unset): the per-module `DEVCOMM_*_OPTIONS` knobs for experiments (docs/TUNING.md).
pub(crate) fn env_options(var: &str) -> Vec<String> {
    std::env::var(var)
        .map(|v| v.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRIVIAL: &str = "#include \"devcomm/devcomm.cuh\"\n\
        extern \"C\" __global__ void touch(dc_u64* p) { devcomm::st_release_sys(p, 1); }\n";

    fn nvrtc_available() -> bool {
        if ensure_nvrtc().is_ok() {
            return true;
        }
        assert!(
            std::env::var_os("DEVCOMM_REQUIRE_NVRTC").is_none(),
            "DEVCOMM_REQUIRE_NVRTC is set but libnvrtc cannot be loaded"
        );
        eprintln!("SKIPPED: libnvrtc not found (set LD_LIBRARY_PATH)");
        false
    }

    #[test]
    fn cache_hits_the_second_time_and_keys_follow_options() {
        if !nvrtc_available() {
            return;
        }
        let dir = std::env::temp_dir().join(format!("devcomm-jit-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let jit = Jit::with_cache_dir(&dir);
        let spec = KernelSpec::new("cache_test", TRIVIAL).name_expression("touch");

        let (first, outcome) = jit.compile_cached(&spec, (9, 0)).unwrap();
        assert_eq!(outcome, CacheOutcome::Compiled);
        let (second, outcome) = jit.compile_cached(&spec, (9, 0)).unwrap();
        assert_eq!(outcome, CacheOutcome::Hit);
        assert_eq!(first, second);
        assert_eq!(second.lowered_names["touch"], "touch");

        let key = cache_key(&spec, (9, 0)).unwrap();
        let with_option = spec.clone().option("-DDEVCOMM_TEST_OPTION=1");
        assert_ne!(key, cache_key(&with_option, (9, 0)).unwrap());
        assert_ne!(key, cache_key(&spec, (10, 0)).unwrap());
        let (_, outcome) = jit.compile_cached(&with_option, (9, 0)).unwrap();
        assert_eq!(outcome, CacheOutcome::Compiled);

        // A damaged entry is a miss, not an error, and gets rewritten.
        std::fs::write(dir.join(format!("{key}.json")), b"{not json").unwrap();
        let (_, outcome) = jit.compile_cached(&spec, (9, 0)).unwrap();
        assert_eq!(outcome, CacheOutcome::Compiled);
        let (_, outcome) = jit.compile_cached(&spec, (9, 0)).unwrap();
        assert_eq!(outcome, CacheOutcome::Hit);

        // No temporary files are left behind.
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn key_covers_source_and_name_expressions() {
        if !nvrtc_available() {
            return;
        }
        let spec = KernelSpec::new("k", TRIVIAL);
        let key = cache_key(&spec, (9, 0)).unwrap();
        assert_eq!(key.len(), 64);
        assert_eq!(key, cache_key(&spec.clone(), (9, 0)).unwrap());
        let other_source = KernelSpec::new("k", format!("{TRIVIAL}\n"));
        assert_ne!(key, cache_key(&other_source, (9, 0)).unwrap());
        assert_ne!(
            key,
            cache_key(&spec.clone().name_expression("touch"), (9, 0)).unwrap()
        );
    }
}
