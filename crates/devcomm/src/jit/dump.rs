//! `DEVCOMM_DUMP_DIR` ([`crate::Config::dump_dir`]): the source, PTX, cubin, lowered names
//! and log of every compile.

use std::path::Path;

use super::{CompiledModule, KernelSpec};
use crate::cuda::nvrtc::Program;
use crate::error::{Error, Result};

/// Writes the source, PTX, cubin, lowered names and log of a successful compile.
pub(super) fn dump(
    dir: &Path,
    spec: &KernelSpec,
    program: &Program,
    module: &CompiledModule,
) -> Result<()> {
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
pub(super) fn dump_failed(dir: Option<&Path>, spec: &KernelSpec, log: &str) -> Result<()> {
    let Some(dir) = dir else {
        return Ok(());
    };
    let io = |context: String| move |source| Error::Io { context, source };
    std::fs::create_dir_all(dir).map_err(io(format!("creating dump dir {}", dir.display())))?;
    for (ext, bytes) in [("cu", spec.source.as_bytes()), ("log", log.as_bytes())] {
        let path = dir.join(format!("{}.{ext}", spec.name));
        std::fs::write(&path, bytes).map_err(io(format!("dumping {}", path.display())))?;
    }
    Ok(())
}
