//! Tests of `kernels.rs`: every module load goes through the one load path, and the spec of
//! each kind holds the options of its setting and every kernel its launch fetches.

use super::*;
use crate::p2p::KernelKey;
use crate::reduce::plan::Algorithm;

/// A configuration with every kernel-options setting set, each to its own value.
fn with_options() -> Config {
    Config::from_lookup(|name| match name {
        "DEVCOMM_P2P_OPTIONS" => Some("-DDC_TEST_P2P=1".into()),
        "DEVCOMM_COLL_OPTIONS" => Some("-DDC_TEST_COLL=2".into()),
        "DEVCOMM_REDUCE_OPTIONS" => Some("-DDC_TEST_REDUCE=3".into()),
        _ => None,
    })
    .expect("valid settings")
}

fn user_hooks() -> RawHooks {
    crate::raw::hooks_with_sizes("Scale", "struct Scale {};", 4, 4).expect("hooks")
}

/// Every kind with every variation the tests cover (plain and hooked reductions, copy and user
/// hooks), each with the option its setting adds.
fn every_kind<'a>(copy: &'a RawHooks, hooks: &'a RawHooks) -> Vec<(KernelKind<'a>, &'static str)> {
    let mut kinds = vec![
        (KernelKind::SendRecv, "-DDC_TEST_P2P=1"),
        (KernelKind::Collective { hooks: copy }, "-DDC_TEST_COLL=2"),
        (KernelKind::Collective { hooks }, "-DDC_TEST_COLL=2"),
    ];
    for dtype in DataType::ALL {
        for hooked in [None, Some((ReduceOp::Sum, hooks))] {
            kinds.push((KernelKind::Reduce { dtype, hooked }, "-DDC_TEST_REDUCE=3"));
            kinds.push((
                KernelKind::ReduceNetStep { dtype, hooked },
                "-DDC_TEST_REDUCE=3",
            ));
        }
    }
    kinds
}

#[test]
fn each_kind_takes_the_options_of_its_own_setting_only() {
    let (copy, hooks) = (RawHooks::copy_of_size(4), user_hooks());
    let all = ["-DDC_TEST_P2P=1", "-DDC_TEST_COLL=2", "-DDC_TEST_REDUCE=3"];
    for net in [false, true] {
        for (kind, option) in every_kind(&copy, &hooks) {
            let spec = kernel_spec(kind, &with_options(), net);
            assert_eq!(spec.options, vec![option], "{kind:?} net {net}");
            let plain = kernel_spec(kind, &Config::default(), net);
            assert!(
                plain.options.iter().all(|o| !all.contains(&o.as_str())),
                "{kind:?}: {:?}",
                plain.options
            );
            // Only the options differ: the same kernels from the same source.
            assert_eq!(plain.source, spec.source, "{kind:?}");
            assert_eq!(plain.name_expressions, spec.name_expressions, "{kind:?}");
        }
    }
}

#[test]
fn network_links_add_only_the_collectives_network_instantiation() {
    let (copy, hooks) = (RawHooks::copy_of_size(4), user_hooks());
    let config = with_options();
    for (kind, _) in every_kind(&copy, &hooks) {
        let (without, with) = (
            kernel_spec(kind, &config, false),
            kernel_spec(kind, &config, true),
        );
        match kind {
            KernelKind::Collective { hooks } => {
                let net = hooks.expression(true, true);
                assert!(!without.name_expressions.contains(&net), "{kind:?}");
                assert!(with.name_expressions.contains(&net), "{kind:?}");
                assert_eq!(with.options, without.options);
            }
            _ => assert_eq!(without, with, "{kind:?}"),
        }
    }
}

/// What each launch fetches from its module is in the module's spec, for every kernel the
/// launches can name (a launch fetching one the spec lacks would fail at first use).
#[test]
fn every_kernel_a_launch_fetches_is_in_its_kinds_spec() {
    let config = Config::default();
    let sendrecv = kernel_spec(KernelKind::SendRecv, &config, false).name_expressions;
    let role = [0u32, 256, 512];
    let mut keys = vec![
        KernelKey::ZeroCopy,
        KernelKey::CeSend,
        KernelKey::ZeroCopyCe,
        KernelKey::Negotiated(true),
        KernelKey::Negotiated(false),
        KernelKey::Barrier,
        KernelKey::Net,
    ];
    for t in [256, 512] {
        keys.extend([
            KernelKey::Split(t, true),
            KernelKey::Split(t, false),
            KernelKey::CeRecv(t),
        ]);
    }
    for s in role {
        keys.extend(
            role.iter()
                .filter(|&&r| s + r > 0)
                .map(|&r| KernelKey::Fused(s, r)),
        );
    }
    for key in keys {
        assert!(sendrecv.contains(&key.expression()), "{key:?}");
    }

    let hooks = user_hooks();
    for net in [false, true] {
        let spec = kernel_spec(KernelKind::Collective { hooks: &hooks }, &config, net);
        for mixed in [false, true] {
            let e = hooks.expression(mixed || net, net);
            assert!(spec.name_expressions.contains(&e), "{e}");
        }
    }

    for dtype in DataType::ALL {
        let plain = kernel_spec(
            KernelKind::Reduce {
                dtype,
                hooked: None,
            },
            &config,
            false,
        );
        let steps = KernelKind::ReduceNetStep {
            dtype,
            hooked: None,
        };
        let steps = kernel_spec(steps, &config, true);
        for op in ReduceOp::ALL {
            for a in [
                Algorithm::OneShot,
                Algorithm::TwoShot,
                Algorithm::ZeroCopyOneShot,
                Algorithm::ZeroCopyTwoShot,
            ] {
                let e = crate::reduce::kernel_expression(a, dtype, op, None);
                assert!(plain.name_expressions.contains(&e), "{e}");
            }
            let e = crate::reduce::net_step_expression(dtype, op, None);
            assert!(steps.name_expressions.contains(&e), "{e}");
            let hooked = Some((op, &hooks));
            let h = kernel_spec(KernelKind::Reduce { dtype, hooked }, &config, false);
            let e = [
                Algorithm::OneShot,
                Algorithm::TwoShot,
                Algorithm::ZeroCopyOneShot,
            ]
            .map(|a| crate::reduce::kernel_expression(a, dtype, op, Some("Scale")));
            assert_eq!(h.name_expressions, e.to_vec());
            let h = kernel_spec(KernelKind::ReduceNetStep { dtype, hooked }, &config, true);
            let e = crate::reduce::net_step_expression(dtype, op, Some("Scale"));
            assert_eq!(h.name_expressions, vec![e]);
        }
    }
}

#[test]
fn the_barrier_and_reductions_with_network_links_name_the_byte_copy_collective() {
    assert!(matches!(KernelKind::barrier(false), KernelKind::SendRecv));
    let KernelKind::Collective { hooks } = KernelKind::barrier(true) else {
        panic!("the barrier with network links is an all-to-all");
    };
    assert_eq!(hooks.key(), RawHooks::copy_of_size(1).key());
    let kinds = KernelKind::reduction(DataType::BF16, None, false);
    assert!(matches!(
        kinds[..],
        [KernelKind::Reduce {
            dtype: DataType::BF16,
            hooked: None
        }]
    ));
    let kinds = KernelKind::reduction(DataType::F32, None, true);
    assert!(matches!(
        kinds[..],
        [
            KernelKind::ReduceNetStep {
                dtype: DataType::F32,
                hooked: None
            },
            KernelKind::Collective { .. }
        ]
    ));
}

/// With NVRTC: the settings' options enter the cache key, so a prewarm without them would
/// miss the cache of the call that has them.
#[test]
fn the_options_enter_the_cache_key() {
    if crate::jit::nvrtc_version().is_err() {
        assert!(
            !crate::config::nvrtc_required(),
            "DEVCOMM_REQUIRE_NVRTC is set but libnvrtc cannot be loaded"
        );
        eprintln!("SKIPPED: libnvrtc not found (set LD_LIBRARY_PATH)");
        return;
    }
    let (copy, hooks) = (RawHooks::copy_of_size(4), user_hooks());
    for (kind, _) in every_kind(&copy, &hooks) {
        let key = |c: &Config| crate::jit::cache_key(&kernel_spec(kind, c, false), (9, 0));
        let (plain, set) = (key(&Config::default()), key(&with_options()));
        assert_ne!(plain.expect("key"), set.expect("key"), "{kind:?}");
    }
}

/// Every file of the crate, with its path under `src/`.
fn sources() -> Vec<(String, String)> {
    fn walk(dir: &std::path::Path, root: &std::path::Path, out: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let name = path.strip_prefix(root).expect("under src");
                let text = std::fs::read_to_string(&path).expect("read file");
                out.push((name.to_string_lossy().replace('\\', "/"), text));
            }
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    out
}

/// The class of bug where a kernel family loads its module itself and forgets to mark the
/// rank as loading (its peers then give up at the gate while it compiles), or builds the spec
/// it loads apart from what `kernel_spec` returns (a prewarmed spec then misses the cache): no
/// file but `kernel_load.rs` and the JIT itself loads a module, and the spec builders are
/// called only by `kernel_spec` and the families' `module_spec` functions (which
/// `kernel_spec` returns for their kinds).
#[test]
fn every_module_load_goes_through_the_one_load_path() {
    let loads = [
        "jit.load(",
        "Jit::load(",
        ".load_every_kernel(",
        ".compile_cached(",
    ];
    let builders = [
        "sendrecv_spec(",
        "kernel_spec(dtype",
        "hooked_kernel_spec(",
        "net_step_spec(",
        "hooks.spec(",
        ".spec(net",
    ];
    let files = sources();
    assert!(files.len() > 50, "found {} files", files.len());
    let mut found = Vec::new();
    for (name, text) in &files {
        let exempt = name == "kernel_load.rs"
            || name == "kernels.rs"
            || name == "kernels_tests.rs"
            || name.starts_with("jit/");
        if exempt {
            continue;
        }
        let mut function = "";
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            if let Some(rest) = code.split("fn ").nth(1) {
                function = rest.split(['(', '<']).next().unwrap_or("");
                continue; // the builders' definitions
            }
            for pattern in &loads {
                if code.contains(pattern) {
                    found.push(format!("src/{name}:{}: {}", n + 1, code));
                }
            }
            for pattern in &builders {
                if code.contains(pattern) && function != "module_spec" {
                    found.push(format!("src/{name}:{}: {}", n + 1, code));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "modules loaded outside kernel_load::load, or specs built outside kernel_spec and the \
         families' module_spec:\n{}",
        found.join("\n")
    );
}

/// With tracing on every module gets the one trace option (another cache key) and nothing
/// else changes; the clock kernel of the trace's setup is the same either way.
#[test]
fn tracing_adds_its_option_to_every_module_but_the_clock() {
    use crate::kernels::TRACE_OPTION;
    let (copy, hooks) = (RawHooks::copy_of_size(4), user_hooks());
    let traced = Config {
        trace: true,
        ..Config::default()
    };
    for (kind, _) in every_kind(&copy, &hooks) {
        for net in [false, true] {
            let plain = kernel_spec(kind, &Config::default(), net);
            let mut with = kernel_spec(kind, &traced, net);
            assert!(!plain.options.iter().any(|o| o == TRACE_OPTION), "{kind:?}");
            assert_eq!(
                with.options.iter().filter(|o| *o == TRACE_OPTION).count(),
                1
            );
            with.options.retain(|o| o != TRACE_OPTION);
            assert_eq!(with, plain, "{kind:?}");
        }
    }
    assert_eq!(
        kernel_spec(KernelKind::TraceClock, &traced, false),
        kernel_spec(KernelKind::TraceClock, &Config::default(), false)
    );
}
