//! The NVRTC wrapper: the only place that calls `cudarc::nvrtc::sys` (an NVRTC program,
//! destroyed on drop; the library check; the version; error texts).

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::OnceLock;

use cudarc::nvrtc::sys;

use crate::error::{Error, Result};

/// A failure of [`Program::compile`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum CompileFailure {
    /// The source did not compile (the log says why).
    Source,
    /// NVRTC failed otherwise.
    Other(Code),
}

/// An NVRTC result code other than success.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Code(sys::nvrtcResult);

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

/// Fails with a clear error instead of cudarc's panic when libnvrtc cannot be loaded.
pub(crate) fn ensure_nvrtc() -> Result<()> {
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

/// An NVRTC program, destroyed on drop. Holds the C strings NVRTC may keep pointers to.
pub(crate) struct Program {
    handle: sys::nvrtcProgram,
    _source: CString,
    _name: CString,
    _headers: Vec<CString>,
    _include_names: Vec<CString>,
}

impl Program {
    /// A program named `name` of `source`, with `headers` ((include name, text) pairs) given
    /// to NVRTC in memory.
    pub(crate) fn create(source: &str, name: &str, headers: &[(&str, &str)]) -> Result<Self> {
        let source = c_string(source, "kernel source")?;
        let name = c_string(name, "kernel name")?;
        let texts = headers
            .iter()
            .map(|(_, text)| c_string(text, "header"))
            .collect::<Result<Vec<_>>>()?;
        let include_names = headers
            .iter()
            .map(|(include, _)| c_string(include, "header name"))
            .collect::<Result<Vec<_>>>()?;
        let headers = texts;
        let header_ptrs: Vec<*const c_char> = headers.iter().map(|h| h.as_ptr()).collect();
        let include_ptrs: Vec<*const c_char> = include_names.iter().map(|h| h.as_ptr()).collect();
        let mut handle: sys::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: NVRTC is loaded (callers run ensure_nvrtc); every pointer is a NUL-terminated
        // string owned by the returned Program, which outlives the handle; both arrays have
        // headers.len() entries.
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

    pub(crate) fn add_name_expression(&self, expression: &str) -> Result<()> {
        let expression = c_string(expression, "name expression")?;
        // SAFETY: the handle is live; NVRTC copies the expression.
        let rc = unsafe { sys::nvrtcAddNameExpression(self.handle, expression.as_ptr()) };
        check(rc, "nvrtcAddNameExpression")
    }

    /// Compiles; the error tells a compile error of the source apart from other failures.
    pub(crate) fn compile(&self, options: &[String]) -> std::result::Result<(), CompileFailure> {
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
            sys::nvrtcResult::NVRTC_ERROR_COMPILATION => Err(CompileFailure::Source),
            code => Err(CompileFailure::Other(Code(code))),
        }
    }

    pub(crate) fn log(&self) -> Result<String> {
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

    pub(crate) fn cubin(&self) -> Result<Vec<u8>> {
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
    pub(crate) fn ptx(&self) -> Option<String> {
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

    pub(crate) fn lowered_name(&self, expression: &str) -> Result<String> {
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

fn check(rc: sys::nvrtcResult, call: &'static str) -> Result<()> {
    match rc {
        sys::nvrtcResult::NVRTC_SUCCESS => Ok(()),
        code => Err(nvrtc_error(call, Code(code), String::new())),
    }
}

/// NVRTC's failure `code` of `call` as an [`Error::Nvrtc`], with `detail` appended.
pub(crate) fn nvrtc_error(call: &'static str, Code(code): Code, detail: String) -> Error {
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

/// `text` as a C string; an error naming `what` if it holds a NUL byte.
pub(crate) fn c_string(text: &str, what: &str) -> Result<CString> {
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
