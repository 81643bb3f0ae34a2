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

mod cache;
mod dump;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

pub use crate::cuda::nvrtc::nvrtc_version;
use crate::cuda::nvrtc::{ensure_nvrtc, nvrtc_error, CompileFailure, Program};
use crate::error::{Error, Result};
pub use cache::{Compiled, Jit, LoadedModule, Prepared};
use dump::{dump, dump_failed};

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
    compile_dumped(spec, arch, None)
}

/// [`compile`], writing the source, PTX, cubin and log into `dump` when given
/// (`DEVCOMM_DUMP_DIR`).
pub(crate) fn compile_dumped(
    spec: &KernelSpec,
    arch: (u32, u32),
    dump_to: Option<&std::path::Path>,
) -> Result<CompiledModule> {
    ensure_nvrtc()?;
    let options = all_options(spec, arch);
    let program = Program::create(
        &spec.source,
        &format!("{}.cu", spec.name),
        crate::device::HEADERS,
    )?;
    for expression in &spec.name_expressions {
        program.add_name_expression(expression)?;
    }
    let compiled = program.compile(&options);
    let log = program.log()?;
    match compiled {
        Ok(()) => {}
        Err(CompileFailure::Source) => {
            dump_failed(dump_to, spec, &log)?;
            return Err(Error::Compile {
                kernel: spec.name.clone(),
                log,
            });
        }
        Err(CompileFailure::Other(code)) => {
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
    if let Some(dir) = dump_to {
        dump(dir, spec, &program, &module)?;
    }
    Ok(module)
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

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
            !crate::config::nvrtc_required(),
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
