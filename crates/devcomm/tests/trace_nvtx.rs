//! The NVTX loader against a stand-in profiler: a shared library built here with the host C++
//! compiler that implements NVTX's injection entry point (`InitializeInjectionNvtx2`), asks
//! for the core module's function table through the export table, fills `RangePushEx` and
//! `RangePop`, and logs every range. Named by `NVTX_INJECTION64_PATH`, as Nsight Systems names
//! its own. One test per process: the variable is read once. Needs `c++` (or `$CXX`).

#[path = "common/cxx.rs"]
#[allow(dead_code)] // builds a shared library itself; only the compiler and scratch helpers
mod cxx;

use std::process::Command;

const TOOL: &str = r#"
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

struct Attributes {  // nvtxEventAttributes_t, version 3
  uint16_t version, size;
  uint32_t category;
  int32_t color_type;
  uint32_t color;
  int32_t payload_type, reserved0;
  uint64_t payload;
  int32_t message_type;
  const char* message;
};
typedef const void* (*GetExportTable)(uint32_t);
struct Callbacks {
  size_t struct_size;
  int (*get_module_function_table)(int module, void**** out_table, unsigned* out_size);
};
struct VersionInfo {
  size_t struct_size;
  uint32_t version, reserved0;
  void (*set_injection_nvtx_version)(uint32_t);
};

static void log_line(const char* what, const char* text) {
  FILE* f = std::fopen(std::getenv("DEVCOMM_TEST_NVTX_LOG"), "a");
  if (!f) return;
  std::fprintf(f, "%s %s\n", what, text);
  std::fclose(f);
}
static int depth = 0;
static int push_ex(const Attributes* a) {
  char line[512];
  std::snprintf(line, sizeof line, "v%u size %u type %d %s", a->version, a->size, a->message_type,
                a->message);
  log_line("push", line);
  return depth++;
}
static int pop() {
  log_line("pop", "");
  return --depth;
}

extern "C" int InitializeInjectionNvtx2(GetExportTable get) {
  const Callbacks* cb = static_cast<const Callbacks*>(get(1));
  const VersionInfo* vi = static_cast<const VersionInfo*>(get(3));
  if (!cb || cb->struct_size < sizeof(Callbacks) || !vi || vi->version != 3) return 0;
  if (get(2) != nullptr) return 0;  // a reserved id: no table
  vi->set_injection_nvtx_version(3);
  void*** table = nullptr;
  unsigned size = 0;
  if (!cb->get_module_function_table(1, &table, &size) || !table || size < 11) return 0;
  if (table[0] != nullptr) return 0;  // index 0 is never a slot
  *reinterpret_cast<int (**)(const Attributes*)>(table[8]) = push_ex;  // RangePushEx
  *reinterpret_cast<int (**)()>(table[11]) = pop;                       // RangePop
  // A module the tool does not fill is still handed out (as NVTX does).
  void*** sync = nullptr;
  if (!cb->get_module_function_table(6, &sync, &size) || !sync) return 0;
  log_line("init", "ok");
  return 1;
}
"#;

#[test]
fn ranges_reach_an_injected_tool() {
    let dir = cxx::scratch_dir("trace_nvtx");
    let source = dir.join("tool.cpp");
    let library = dir.join("libtool.so");
    let log = dir.join("log.txt");
    std::fs::write(&source, TOOL).unwrap();
    let built = match Command::new(cxx::compiler())
        .args(["-std=c++17", "-shared", "-fPIC", "-Wall", "-Werror", "-o"])
        .arg(&library)
        .arg(&source)
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("DEVCOMM_REQUIRE_CXX").is_none(),
                "no host C++ compiler"
            );
            eprintln!("SKIPPED: no host C++ compiler");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    std::env::set_var("DEVCOMM_TEST_NVTX_LOG", &log);
    std::env::set_var(devcomm::trace::nvtx::INJECTION_VARIABLE, &library);

    assert!(devcomm::trace::nvtx::enabled());
    assert!(devcomm::trace::nvtx::push(|| {
        "devcomm:all_reduce bytes=4096".into()
    }));
    devcomm::trace::nvtx::pop();
    {
        let _range = devcomm::trace::nvtx::Range::new(|| "devcomm:trace phase".into());
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        text,
        "init ok\n\
         push v3 size 48 type 1 devcomm:all_reduce bytes=4096\npop \n\
         push v3 size 48 type 1 devcomm:trace phase\npop \n"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
