//! `devcomm precompile`: fills the kernel cache for a GPU architecture without a GPU, so that
//! a machine (or a container image) starts with every kernel compiled: the send/recv kernels,
//! the collective kernel for the copy hooks of every element size and for both examples'
//! hooks, the reductions, and any f32 hooks given with `--hooks`. Every spec comes from
//! `devcomm::kernel_spec`, which the library's own loads use, under the configuration read
//! from the environment: the cache is `DEVCOMM_CACHE_DIR` (or the default of
//! `Config::kernel_cache_dir`), and `DEVCOMM_P2P_OPTIONS`, `DEVCOMM_COLL_OPTIONS` and
//! `DEVCOMM_REDUCE_OPTIONS` apply as they do at run time. The cache key holds NVRTC's
//! version: the machine that reads the cache must have the same NVRTC major.minor, or it
//! compiles again.

use std::sync::Mutex;
use std::time::Instant;

use devcomm::jit::{CacheOutcome, Jit, KernelSpec};
use devcomm::{kernel_spec, Config, DataType, Hooks, KernelKind, RawHooks};

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
    /// transpose and fp8 hooks), `reduce` (the reductions for every type, and the RMSNorm,
    /// RMSNorm + FP8 and accumulate epilogues), `moe` (MoE dispatch and combine for bf16, f16
    /// and f32 rows). Comma-separated; default: all; `none` for
    /// only `--hooks`.
    #[arg(
        long,
        default_value = "sendrecv,copy1,copy2,copy4,copy8,copy16,examples,reduce,moe"
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

/// The reduction kernels: every element type, the RMSNorm and accumulate epilogues (f32 sum)
/// and the RMSNorm + FP8 one (bf16 sum); `net`: the network path's local steps and the
/// byte-copy collective instead (docs/NETWORK.md).
fn reduce_specs(config: &Config, net: bool) -> Vec<(String, KernelSpec)> {
    use devcomm::{DataType, ReduceOp};
    let tag = if net { " (network peers)" } else { "" };
    let mut v = Vec::new();
    let mut add = |what: String, kinds: Vec<KernelKind<'_>>| {
        for kind in kinds {
            v.push((format!("{what}{tag}"), kernel_spec(kind, config, net)));
        }
    };
    for t in DataType::ALL {
        add(format!("reduce {t}"), KernelKind::reduction(t, None, net));
    }
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
        let hooked = Some((ReduceOp::Sum, hooks.raw()));
        add(
            format!("reduce {name}"),
            KernelKind::reduction(DataType::F32, hooked, net),
        );
    }
    // The bf16 all-reduce + residual + RMSNorm + FP8 example's epilogue.
    let fp8 = Hooks::<half::bf16, half::bf16>::new(
        "RmsNormFp8",
        include_str!("../../devcomm/examples/hooks/rmsnorm_fp8.cu"),
    );
    add(
        "reduce RmsNormFp8".into(),
        KernelKind::reduction(DataType::BF16, Some((ReduceOp::Sum, fp8.raw())), net),
    );
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

/// What `args` asks to compile under `config`: a name for the output, and the spec that a
/// communicator with these settings loads ([`devcomm::kernel_spec`]), each module once.
fn specs(args: &PrecompileArgs, config: &Config) -> Result<Vec<(String, KernelSpec)>, String> {
    let mut specs: Vec<(String, KernelSpec)> = Vec::new();
    let collective = |h: &RawHooks| -> (String, KernelSpec) {
        let net = if args.net { " (network peers)" } else { "" };
        let kind = KernelKind::Collective { hooks: h };
        (
            format!("collective {}{net}", h.name()),
            kernel_spec(kind, config, args.net),
        )
    };
    for what in args.builtin.split(',').map(str::trim) {
        let hooks: RawHooks = match what {
            "none" => continue,
            "sendrecv" => {
                let spec = kernel_spec(KernelKind::SendRecv, config, args.net);
                specs.push(("sendrecv".into(), spec));
                continue;
            }
            "copy1" => Hooks::<u8>::copy().into(),
            "copy2" => Hooks::<u16>::copy().into(),
            "copy4" => Hooks::<f32>::copy().into(),
            "copy8" => Hooks::<u64>::copy().into(),
            "copy16" => Hooks::<[u32; 4]>::copy().into(),
            "examples" => {
                for h in example_hooks() {
                    specs.push(collective(h.raw()));
                }
                continue;
            }
            "reduce" => {
                specs.extend(reduce_specs(config, args.net));
                continue;
            }
            "moe" => {
                for t in [DataType::BF16, DataType::F16, DataType::F32] {
                    let spec = kernel_spec(KernelKind::Moe { dtype: t }, config, args.net);
                    specs.push((format!("moe {t}"), spec));
                }
                continue;
            }
            other => return Err(format!("--builtin: unknown kernel set `{other}`")),
        };
        specs.push(collective(&hooks));
    }
    for spec in &args.hooks {
        let hooks = f32_hooks(spec)?;
        specs.push(collective(hooks.raw()));
    }
    // The network reductions and `copy1` name the same byte-copy collective: compile it once.
    let mut unique: Vec<(String, KernelSpec)> = Vec::with_capacity(specs.len());
    for (what, spec) in specs {
        if !unique.iter().any(|(_, s)| *s == spec) {
            unique.push((what, spec));
        }
    }
    Ok(unique)
}

pub fn run(args: &PrecompileArgs) -> Result<i32, String> {
    let arch = parse_arch(&args.arch)?;
    // The settings that enter the kernels' cache keys (their experiment options).
    let config = Config::from_env().map_err(|e| e.to_string())?;
    let specs = specs(args, &config)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: PrecompileArgs,
    }

    fn args(line: &[&str]) -> PrecompileArgs {
        Cli::parse_from(std::iter::once("precompile").chain(line.iter().copied())).args
    }

    /// Settings as `DEVCOMM_*_OPTIONS` give them.
    fn config() -> Config {
        Config::from_lookup(|name| match name {
            "DEVCOMM_P2P_OPTIONS" => Some("-DDC_TEST_P2P=1".into()),
            "DEVCOMM_COLL_OPTIONS" => Some("-DDC_TEST_COLL=1".into()),
            "DEVCOMM_REDUCE_OPTIONS" => Some("-DDC_TEST_REDUCE=1".into()),
            _ => None,
        })
        .expect("valid settings")
    }

    /// The cache key of `spec`, or its whole text where NVRTC (whose version enters the key)
    /// is missing: either way equal exactly when the cache entry is the same.
    fn key(spec: &KernelSpec) -> String {
        devcomm::jit::cache_key(spec, (9, 0)).unwrap_or_else(|_| format!("{spec:?}"))
    }

    /// What `devcomm precompile` compiles under `DEVCOMM_*_OPTIONS` is what a communicator
    /// with the same settings loads for each kind, with and without network links.
    #[test]
    fn precompile_fills_the_keys_the_library_asks_for() {
        let config = config();
        for net in [false, true] {
            let line: &[&str] = if net { &["--net"] } else { &[] };
            let keys: Vec<String> = specs(&args(line), &config)
                .expect("specs")
                .iter()
                .map(|(_, s)| key(s))
                .collect();
            let byte_copy = RawHooks::from(Hooks::<u8>::copy());
            let f32_copy = RawHooks::from(Hooks::<f32>::copy());
            let mut wanted = vec![
                KernelKind::SendRecv,
                KernelKind::Collective { hooks: &byte_copy },
                KernelKind::Collective { hooks: &f32_copy },
            ];
            for dtype in devcomm::DataType::ALL {
                wanted.extend(KernelKind::reduction(dtype, None, net));
            }
            for kind in wanted {
                let library = kernel_spec(kind, &config, net);
                assert!(library.options.iter().any(|o| o.starts_with("-DDC_TEST_")));
                assert!(
                    keys.contains(&key(&library)),
                    "{kind:?} (net {net}) is not precompiled with the library's key"
                );
                let unset = kernel_spec(kind, &Config::default(), net);
                assert!(!keys.contains(&key(&unset)), "{kind:?}: options ignored");
            }
        }
    }

    #[test]
    fn every_module_is_compiled_once() {
        let all = specs(&args(&["--net"]), &Config::default()).expect("specs");
        for (i, (what, spec)) in all.iter().enumerate() {
            assert!(!all[..i].iter().any(|(_, s)| s == spec), "{what} twice");
        }
        assert!(specs(&args(&["--builtin", "nope"]), &Config::default()).is_err());
    }
}
