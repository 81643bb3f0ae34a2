//! Compiles every kernel module with NVRTC for sm_90 (no GPU needed) with tracing off and on
//! (`DEVCOMM_TRACE=1`, `-DDC_TRACE=1`): both compile without warnings, only the traced build
//! has the ring's global `dc_trace_ring`, the traced spec is another cache key, and the
//! untraced spec carries no trace option. Also the clock kernel of the trace's setup.
//!
//! Needs libnvrtc on the loader path; without it the tests print SKIPPED and pass, unless
//! `DEVCOMM_REQUIRE_NVRTC` is set (CI sets it).

mod common;
use common::{nvrtc_available, SM90};
use devcomm::jit;
use devcomm::kernels::TRACE_OPTION;
use devcomm::{kernel_spec, Config, DataType, KernelKind};

fn traced() -> Config {
    let mut config = Config::default();
    config.trace = true;
    config
}

fn has_symbol(cubin: &[u8], name: &str) -> bool {
    cubin.windows(name.len()).any(|w| w == name.as_bytes())
}

/// Every module family, with and without network links.
fn kinds() -> Vec<(KernelKind<'static>, bool, &'static str)> {
    vec![
        (KernelKind::SendRecv, false, "send/recv"),
        (KernelKind::barrier(true), false, "collective"),
        (
            KernelKind::Reduce {
                dtype: DataType::BF16,
                hooked: None,
            },
            false,
            "reduce bf16",
        ),
        (
            KernelKind::ReduceNetStep {
                dtype: DataType::F32,
                hooked: None,
            },
            true,
            "net step f32",
        ),
    ]
}

#[test]
fn every_module_compiles_traced_and_untraced() {
    if !nvrtc_available() {
        return;
    }
    for (kind, net, what) in kinds() {
        let plain = kernel_spec(kind, &Config::default(), net);
        let with = kernel_spec(kind, &traced(), net);
        assert!(
            !plain.options.iter().any(|o| o.contains("DC_TRACE")),
            "{what}: {:?}",
            plain.options
        );
        assert_eq!(
            with.options.last().map(String::as_str),
            Some(TRACE_OPTION),
            "{what}"
        );
        assert_eq!(
            (&with.source, &with.name_expressions),
            (&plain.source, &plain.name_expressions)
        );
        assert_ne!(
            jit::cache_key(&plain, SM90).unwrap(),
            jit::cache_key(&with, SM90).unwrap()
        );
        for (spec, on) in [(&plain, false), (&with, true)] {
            let module =
                jit::compile(spec, SM90).unwrap_or_else(|e| panic!("{what} (trace {on}): {e}"));
            assert!(
                module.log.is_empty(),
                "{what} (trace {on}): warnings:\n{}",
                module.log
            );
            assert_eq!(
                module.lowered_names.len(),
                spec.name_expressions.len(),
                "{what}"
            );
            assert_eq!(
                has_symbol(&module.cubin, "dc_trace_ring"),
                on,
                "{what} (trace {on})"
            );
        }
    }
}

#[test]
fn the_clock_kernel_compiles() {
    if !nvrtc_available() {
        return;
    }
    let module = jit::compile(&devcomm::trace::clock::spec(), SM90).unwrap();
    assert_eq!(module.lowered_names["dc_trace_clock"], "dc_trace_clock");
    assert!(module.log.is_empty(), "{}", module.log);
}
