//! NVTX ranges without the CUDA toolkit: the loading half of NVTX v3, in Rust.
//!
//! A profiler (Nsight Systems, or any NVTX tool) announces itself through the environment
//! variable `NVTX_INJECTION64_PATH`, the path of its injection library. At the first range this
//! module (like NVTX's header-only C code) opens that library, calls its
//! `InitializeInjectionNvtx2` with an export-table getter, and the tool fills the function
//! slots of the modules it handles (the core module's `RangePushEx` and `RangePop` are the
//! ones used here). Without the variable, or when the tool declines, every later range costs
//! one relaxed atomic load and builds no message. The variable is the tool's, not a devcomm
//! setting (docs/CONFIG.md): it is read here, once, as NVTX itself reads it.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};
use std::sync::OnceLock;

/// The environment variable naming the tool's injection library.
pub const INJECTION_VARIABLE: &str = "NVTX_INJECTION64_PATH";

/// Slots per callback module (more than any module has; a tool fills those it knows).
const SLOTS: usize = 64;
/// Callback modules (`NvtxCallbackModule`): CORE = 1 ... SYNC = 6.
const MODULES: usize = 7;
const MODULE_CORE: c_int = 1;
/// Core callback ids (`NvtxCallbackIdCore`).
const CBID_RANGE_PUSH_EX: usize = 8;
const CBID_RANGE_POP: usize = 11;
/// Export table ids (`NvtxExportTableID`).
const ETID_CALLBACKS: u32 = 1;
const ETID_VERSIONINFO: u32 = 3;
/// `NVTX_VERSION`.
const VERSION: u32 = 3;

type Slot = AtomicPtr<c_void>;
#[allow(clippy::declare_interior_mutable_const)] // the array initialisers only
const EMPTY: Slot = AtomicPtr::new(std::ptr::null_mut());
#[allow(clippy::declare_interior_mutable_const)]
const ROW: [Slot; SLOTS] = [EMPTY; SLOTS];
/// The function slots of every module: the tool writes its functions here.
static SLOTS_OF: [[Slot; SLOTS]; MODULES] = [ROW; MODULES];

/// 0: not tried, 1: a tool is attached, 2: none.
static STATE: AtomicU8 = AtomicU8::new(0);
static INIT: OnceLock<bool> = OnceLock::new();

/// `nvtxEventAttributes_t` (version 3, 48 bytes).
#[repr(C)]
struct EventAttributes {
    version: u16,
    size: u16,
    category: u32,
    color_type: i32,
    color: u32,
    payload_type: i32,
    reserved0: i32,
    payload: u64,
    message_type: i32,
    message: *const c_char,
}
const _: () = assert!(std::mem::size_of::<EventAttributes>() == 48);

#[repr(C)]
struct ExportTableCallbacks {
    struct_size: usize,
    get_module_function_table:
        unsafe extern "C" fn(c_int, *mut *const *mut c_void, *mut c_uint) -> c_int,
}

#[repr(C)]
struct ExportTableVersionInfo {
    struct_size: usize,
    version: u32,
    reserved0: u32,
    set_injection_nvtx_version: unsafe extern "C" fn(u32),
}

/// The per-module tables of slot addresses the tool writes through (index 0 unused).
struct Tables([[*mut c_void; SLOTS]; MODULES]);
// SAFETY: the addresses point into the static slots; only the tool writes through them.
unsafe impl Sync for Tables {}
// SAFETY: as above.
unsafe impl Send for Tables {}

fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let mut t = [[std::ptr::null_mut(); SLOTS]; MODULES];
        for (m, row) in t.iter_mut().enumerate() {
            for (i, slot) in row.iter_mut().enumerate().skip(1) {
                *slot = SLOTS_OF[m][i].as_ptr().cast();
            }
        }
        Tables(t)
    })
}

unsafe extern "C" fn get_module_function_table(
    module: c_int,
    out_table: *mut *const *mut c_void,
    out_size: *mut c_uint,
) -> c_int {
    if module < 1 || module as usize >= MODULES {
        return 0;
    }
    // SAFETY: the tool passes valid out-pointers (or null, which NVTX allows).
    unsafe {
        if !out_table.is_null() {
            *out_table = tables().0[module as usize].as_ptr();
        }
        if !out_size.is_null() {
            *out_size = (SLOTS - 1) as c_uint;
        }
    }
    1
}

unsafe extern "C" fn set_injection_nvtx_version(_version: u32) {}

static CALLBACKS: ExportTableCallbacks = ExportTableCallbacks {
    struct_size: std::mem::size_of::<ExportTableCallbacks>(),
    get_module_function_table,
};
static VERSION_INFO: ExportTableVersionInfo = ExportTableVersionInfo {
    struct_size: std::mem::size_of::<ExportTableVersionInfo>(),
    version: VERSION,
    reserved0: 0,
    set_injection_nvtx_version,
};

unsafe extern "C" fn get_export_table(id: u32) -> *const c_void {
    match id {
        ETID_CALLBACKS => (&CALLBACKS as *const ExportTableCallbacks).cast(),
        ETID_VERSIONINFO => (&VERSION_INFO as *const ExportTableVersionInfo).cast(),
        _ => std::ptr::null(),
    }
}

/// Opens the injection library at `path` and lets it fill the slots. True when the tool
/// accepted (its init returned non-zero).
pub fn load_tool(path: &std::path::Path) -> bool {
    type Init = unsafe extern "C" fn(unsafe extern "C" fn(u32) -> *const c_void) -> c_int;
    // SAFETY: loading a library runs its initialisers: the profiler the user attached.
    let lib = match unsafe { libloading::Library::new(path) } {
        Ok(lib) => lib,
        Err(e) => {
            log::warn!("NVTX: cannot load {}: {e}", path.display());
            return false;
        }
    };
    // SAFETY: NVTX's documented entry point and signature.
    let accepted = match unsafe { lib.get::<Init>(b"InitializeInjectionNvtx2\0") } {
        // SAFETY: as above; the getter and its tables live for the whole process.
        Ok(init) => (unsafe { init(get_export_table) }) != 0,
        Err(e) => {
            log::warn!(
                "NVTX: {} has no InitializeInjectionNvtx2: {e}",
                path.display()
            );
            false
        }
    };
    // The tool stays loaded for the life of the process, as with NVTX's own loader.
    std::mem::forget(lib);
    accepted
}

/// Whether a tool is attached (loads it at the first call).
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let on = *INIT.get_or_init(|| {
                std::env::var_os(INJECTION_VARIABLE)
                    .filter(|p| !p.is_empty())
                    .is_some_and(|p| load_tool(std::path::Path::new(&p)))
            });
            STATE.store(if on { 1 } else { 2 }, Ordering::Relaxed);
            on
        }
    }
}

/// Pushes a range whose message `message()` builds (only when a tool is attached). True when
/// a range was pushed: the caller pops it ([`pop`]).
pub fn push(message: impl FnOnce() -> String) -> bool {
    if !enabled() {
        return false;
    }
    let f = SLOTS_OF[MODULE_CORE as usize][CBID_RANGE_PUSH_EX].load(Ordering::Acquire);
    if f.is_null() {
        return false;
    }
    let text = CString::new(message().replace('\0', " ")).unwrap_or_default();
    let attributes = EventAttributes {
        version: VERSION as u16,
        size: std::mem::size_of::<EventAttributes>() as u16,
        category: 0,
        color_type: 1, // ARGB
        color: 0xff76_b900,
        payload_type: 0,
        reserved0: 0,
        payload: 0,
        message_type: 1, // ASCII
        message: text.as_ptr(),
    };
    // SAFETY: the tool stored its nvtxRangePushEx here; the attributes and text outlive the
    // call (the tool copies what it keeps).
    let push: unsafe extern "C" fn(*const EventAttributes) -> c_int =
        unsafe { std::mem::transmute(f) };
    // SAFETY: the tool's function, with attributes valid for the call.
    unsafe { push(&attributes) };
    true
}

/// Pops the range of the last [`push`] that returned true.
pub fn pop() {
    let f = SLOTS_OF[MODULE_CORE as usize][CBID_RANGE_POP].load(Ordering::Acquire);
    if f.is_null() {
        return;
    }
    // SAFETY: the tool stored its nvtxRangePop here.
    let pop: unsafe extern "C" fn() -> c_int = unsafe { std::mem::transmute(f) };
    // SAFETY: the tool's function, which takes nothing.
    unsafe { pop() };
}

/// A range open until dropped (for callers outside the launch paths, e.g. the CLI's phases).
#[derive(Debug)]
pub struct Range(bool);

impl Range {
    /// Opens a range named by `message()` (built only when a tool is attached).
    pub fn new(message: impl FnOnce() -> String) -> Self {
        Self(push(message))
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        if self.0 {
            pop();
        }
    }
}
