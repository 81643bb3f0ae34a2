//! `devcomm precompile`: fills the kernel cache for a GPU architecture without a GPU, so that
//! a machine (or a container image) starts with every kernel compiled: the send/recv kernels,
//! the collective kernel for the copy hooks of every element size and for both examples'
//! hooks, and any f32 hooks given with `--hooks`. The cache is `DEVCOMM_CACHE_DIR` (or the
//! default of `devcomm::jit::Jit::new`); `DEVCOMM_COLL_OPTIONS` applies as it would at run
//! time. The cache key holds NVRTC's version: the machine that reads the cache must have the
//! same NVRTC major.minor, or it compiles again.

use std::sync::Mutex;
use std::time::Instant;

use devcomm::jit::{CacheOutcome, Jit, KernelSpec};
use devcomm::{Hooks, RawHooks};

#[derive(Debug, clap::Args)]
pub struct PrecompileArgs {
    /// Compute capability, e.g. 9.0 for H100 and H200.
    #[arg(long, default_value = "9.0")]
    arch: String,
    /// Also the collective kernel for these f32 hooks, each `FILE:STRUCT`. Repeatable.
    #[arg(long = "hooks", value_name = "FILE:STRUCT")]
    hooks: Vec<String>,
    /// The built-in kernels to compile: `sendrecv`, `copy1`, `copy2`, `copy4`, `copy8`,
    /// `copy16` (the collective with the copy hooks of that element size), `examples` (the
    /// transpose and fp8 hooks), `reduce` (the reductions for every type, and the RMSNorm
    /// example's epilogue). Comma-separated; default: all; `none` for only `--hooks`.
    #[arg(
        long,
        default_value = "sendrecv,copy1,copy2,copy4,copy8,copy16,examples,reduce"
    )]
    builtin: String,
    /// Compiles at once.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// The kernels of communicators with network links instead: the collectives' instantiation
    /// for network peers and the reductions' local steps (docs/NETWORK.md).
    #[arg(long)]
    net: bool,
}

fn parse_arch(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("--arch {s}: expected MAJOR.MINOR, e.g. 9.0");
    let (major, minor) = s.split_once('.').ok_or_else(bad)?;
    Ok((
        major.parse().map_err(|_| bad())?,
        minor.parse().map_err(|_| bad())?,
    ))
}

/// The examples' hooks (crates/devcomm/examples/hooks): the transpose and the fp8 one.
pub(crate) fn example_hooks() -> [Hooks<f32>; 2] {
    [
        Hooks::<f32, f32>::new(
            "Transpose",
            include_str!("../../devcomm/examples/hooks/transpose.cu"),
        ),
        Hooks::<f32, f32>::new("Fp8", include_str!("../../devcomm/examples/hooks/fp8.cu")),
    ]
}

/// The reduction kernels: every element type, and the RMSNorm and accumulate epilogues (f32
/// sum); `net`: the network path's local steps instead (docs/NETWORK.md).
fn reduce_specs(options: &[String], net: bool) -> Vec<(String, KernelSpec)> {
    use devcomm::reduce::{hooked_kernel_spec, hooked_net_step_spec, kernel_spec, net_step_spec};
    use devcomm::{DataType, ReduceOp};
    let tag = if net { " (network peers)" } else { "" };
    let mut v: Vec<_> = DataType::ALL
        .into_iter()
        .map(|t| {
            let spec = if net {
                net_step_spec(t)
            } else {
                kernel_spec(t)
            };
            (format!("reduce {t}{tag}"), spec)
        })
        .collect();
    for (name, source) in [
        (
            "RmsNorm",
            include_str!("../../devcomm/examples/hooks/rmsnorm.cu"),
        ),
        (
            "Accumulate",
            include_str!("../../devcomm/examples/hooks/accumulate.cu"),
        ),
    ] {
        let hooks = Hooks::<f32, f32>::new(name, source);
        let (f32, sum) = (DataType::F32, ReduceOp::Sum);
        let spec = if net {
            hooked_net_step_spec(f32, sum, hooks.raw())
        } else {
            hooked_kernel_spec(f32, sum, hooks.raw())
        };
        v.push((format!("reduce {name}{tag}"), spec));
    }
    for (_, spec) in &mut v {
        spec.options.extend(options.iter().cloned());
    }
    v
}

/// f32 hooks from a `--hooks FILE:STRUCT` argument: the struct `STRUCT` of the CUDA C++ file.
pub(crate) fn f32_hooks(arg: &str) -> Result<Hooks<f32>, String> {
    let (file, name) = arg
        .rsplit_once(':')
        .ok_or_else(|| format!("--hooks {arg}: expected FILE:STRUCT"))?;
    let source = std::fs::read_to_string(file).map_err(|err| format!("--hooks {file}: {err}"))?;
    Ok(Hooks::<f32, f32>::new(name, source))
}

pub fn run(args: &PrecompileArgs) -> Result<i32, String> {
    let arch = parse_arch(&args.arch)?;
    // The settings that enter the kernels' cache keys (their experiment options).
    let config = devcomm::Config::from_env().map_err(|e| e.to_string())?;
    let mut specs: Vec<(String, KernelSpec)> = Vec::new();
    let collective = |h: &RawHooks| -> (String, KernelSpec) {
        let net = if args.net { " (network peers)" } else { "" };
        (
            format!("collective {}{net}", h.name()),
            h.spec_for(&config.coll_options, args.net),
        )
    };
    let copy = |h: RawHooks| -> Result<(String, KernelSpec), String> { Ok(collective(&h)) };
    for what in args.builtin.split(',').map(str::trim) {
        let spec = match what {
            "none" => continue,
            "sendrecv" => Ok((
                "sendrecv".into(),
                devcomm::p2p::sendrecv_spec(&config.p2p_options),
            )),
            "copy1" => copy(Hooks::<u8>::copy().into()),
            "copy2" => copy(Hooks::<u16>::copy().into()),
            "copy4" => copy(Hooks::<f32>::copy().into()),
            "copy8" => copy(Hooks::<u64>::copy().into()),
            "copy16" => copy(Hooks::<[u32; 4]>::copy().into()),
            "examples" => {
                for h in example_hooks() {
                    specs.push(collective(h.raw()));
                }
                continue;
            }
            "reduce" => {
                specs.extend(reduce_specs(&config.reduce_options, args.net));
                continue;
            }
            other => return Err(format!("--builtin: unknown kernel set `{other}`")),
        };
        specs.push(spec.map_err(|e| e.to_string())?);
    }
    for spec in &args.hooks {
        let hooks = f32_hooks(spec)?;
        specs.push(collective(hooks.raw()));
    }
    let jit = Jit::from_config(&config);
    println!(
        "compiling {} kernels for sm_{}{} into {}",
        specs.len(),
        arch.0,
        arch.1,
        jit.cache_dir().display()
    );
    let queue = Mutex::new(specs.into_iter());
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..args.jobs.max(1) {
            s.spawn(|| loop {
                let Some((what, spec)) = queue.lock().map(|mut q| q.next()).ok().flatten() else {
                    return;
                };
                let t0 = Instant::now();
                match jit.compile_cached(&spec, arch) {
                    Ok((_, outcome)) => {
                        let how = match outcome {
                            CacheOutcome::Hit => "already cached",
                            CacheOutcome::Compiled => "compiled",
                        };
                        println!("{what}: {how} ({:.1} s)", t0.elapsed().as_secs_f64());
                    }
                    Err(e) => {
                        eprintln!("{what}: {e}");
                        if let Ok(mut f) = failures.lock() {
                            f.push(what);
                        }
                    }
                }
            });
        }
    });
    let failed = failures.into_inner().map_err(|e| e.to_string())?;
    if failed.is_empty() {
        Ok(0)
    } else {
        Err(format!(
            "{} kernels failed to compile: {failed:?}",
            failed.len()
        ))
    }
}
