//! [`Jit`]: the on-disk cubin cache (content-addressed, written atomically) and the
//! in-process memo of loaded modules; [`LoadedModule`].

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use super::{cache_key, compile_dumped, CacheOutcome, CompiledModule, KernelSpec};
use crate::config::Config;
use crate::error::{CudaResultExt, Error, Result};

/// The JIT: compiles through a disk cache and memoises loaded modules per device.
///
/// Share one `Jit` per process (e.g. in the communicator); [`Jit::load`] of the same spec on the
/// same device then returns the same module without touching disk or NVRTC.
#[derive(Debug)]
pub struct Jit {
    cache_dir: PathBuf,
    /// Where every compile is dumped (`DEVCOMM_DUMP_DIR`); the cache is bypassed then.
    dump_dir: Option<PathBuf>,
    memo: Mutex<HashMap<(usize, String), Arc<LoadedModule>>>,
}

impl Jit {
    /// A JIT caching where the configuration says ([`Config::kernel_cache_dir`]: the
    /// `DEVCOMM_CACHE_DIR`, else `$HOME/.cache/devcomm/kernels`, else a `devcomm-kernels`
    /// directory in the system's temporary directory) and dumping into its `dump_dir`. The
    /// directory is created on the first store.
    pub fn from_config(config: &Config) -> Self {
        Self {
            dump_dir: config.dump_dir.clone(),
            ..Self::with_cache_dir(config.kernel_cache_dir())
        }
    }

    /// A JIT caching in `dir`, dumping nothing.
    pub fn with_cache_dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            cache_dir: dir.into(),
            dump_dir: None,
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
        if self.dump_dir.is_none() {
            if let Some(module) = self.read_cache(&key, spec) {
                return Ok((module, CacheOutcome::Hit));
            }
        }
        let module = compile_dumped(spec, arch, self.dump_dir.as_deref())?;
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
        match self.compile_for(ctx, spec)? {
            Prepared::Loaded(loaded) => Ok(loaded),
            Prepared::Compiled(compiled) => self.load_compiled(ctx, compiled),
        }
    }

    /// The first half of [`load`](Self::load), which touches no GPU: the module of `spec` on
    /// the device of `ctx` if it is loaded already, else its compiled code (to hand to
    /// [`load_compiled`](Self::load_compiled)).
    pub fn compile_for(&self, ctx: &Arc<CudaContext>, spec: &KernelSpec) -> Result<Prepared> {
        let arch = device_arch(ctx)?;
        let memo_key = (ctx.ordinal(), cache_key(spec, arch)?);
        if let Some(module) = self.memo().get(&memo_key) {
            return Ok(Prepared::Loaded(module.clone()));
        }
        // Not holding the lock while compiling: two threads may compile the same spec at once,
        // which costs time but is correct (the first insert wins in `load_compiled`).
        let code = self.compile_cached(spec, arch)?.0;
        Ok(Prepared::Compiled(Compiled {
            name: spec.name.clone(),
            code,
            memo_key,
        }))
    }

    /// The second half of [`load`](Self::load): loads `compiled` (from
    /// [`compile_for`](Self::compile_for) on the same `ctx`) on the device of `ctx`. The
    /// driver may wait here for kernels already running on that device.
    pub fn load_compiled(
        &self,
        ctx: &Arc<CudaContext>,
        compiled: Compiled,
    ) -> Result<Arc<LoadedModule>> {
        let module = ctx
            .load_module(Ptx::from_binary(compiled.code.cubin))
            .cuda(-1, "cuModuleLoadData")?;
        let loaded = Arc::new(LoadedModule {
            name: compiled.name,
            module,
            lowered_names: compiled.code.lowered_names,
        });
        Ok(self
            .memo()
            .entry(compiled.memo_key)
            .or_insert(loaded)
            .clone())
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

/// What [`Jit::compile_for`] found: the module loaded already, or its code to load.
#[derive(Debug)]
pub enum Prepared {
    /// Loaded on that device already (the same module every time).
    Loaded(Arc<LoadedModule>),
    /// Compiled (or read from the disk cache), not loaded yet.
    Compiled(Compiled),
}

/// A module compiled for one device and not loaded yet ([`Jit::load_compiled`] loads it).
#[derive(Debug)]
pub struct Compiled {
    name: String,
    code: CompiledModule,
    /// Where the loaded module is memoised: (device ordinal, cache key).
    memo_key: (usize, String),
}

/// The compute capability of the GPU of `ctx` (the architecture a module is compiled for).
fn device_arch(ctx: &CudaContext) -> Result<(u32, u32)> {
    let (major, minor) = ctx
        .compute_capability()
        .cuda(-1, "cuDeviceGetAttribute(COMPUTE_CAPABILITY)")?;
    Ok((major as u32, minor as u32))
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
            crate::cuda::load_function_now(&f)?;
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
