//! The fake's exported symbols, read from the built library's ELF dynamic symbol table, against
//! two checked-in lists: `symbols/exported.txt` (exactly what the fake exports, so adding or
//! losing an export is a reviewed change) and `symbols/nvml-13.h.txt` (every function the
//! current nvml.h declares, all of which a client like go-nvml resolves at load).

mod common;

use object::{Object, ObjectSymbol};
use std::collections::BTreeSet;
use std::path::PathBuf;

fn list(name: &str) -> BTreeSet<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("symbols")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// Defined, exported function symbols of the built `libfake_nvml.so` named `nvml*`/`fakeNvml*`.
fn exported() -> BTreeSet<String> {
    let path = common::lib_path();
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = object::File::parse(&*data).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    file.dynamic_symbols()
        .filter(|s| s.is_definition() && s.is_global())
        .filter_map(|s| s.name().ok().map(str::to_string))
        .filter(|n| n.starts_with("nvml") || n.starts_with("fakeNvml"))
        .collect()
}

#[test]
fn exports_match_the_checked_in_list() {
    let got = exported();
    let want = list("exported.txt");
    let missing: Vec<_> = want.difference(&got).collect();
    let extra: Vec<_> = got.difference(&want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "exports differ from symbols/exported.txt\nmissing: {missing:?}\nnew: {extra:?}"
    );
}

#[test]
fn every_nvml_13_function_is_exported() {
    let got = exported();
    let header = list("nvml-13.h.txt");
    assert!(header.len() > 400, "header list read: {}", header.len());
    let missing: Vec<_> = header.difference(&got).collect();
    assert!(
        missing.is_empty(),
        "nvml.h functions the fake lacks: {missing:?}"
    );
    // The ones go-nvml measured missing before stubs were generated from the header.
    for s in ["nvmlDeviceGetHostname_v1", "nvmlSystemGetCPER_v1"] {
        assert!(got.contains(s), "{s}");
    }
}

#[test]
fn new_header_symbols_answer_not_supported() {
    let _fake = common::Fake::new("h100-80gb");
    let path = common::lib_path();
    // SAFETY: the fake's stubs take no arguments and return nvmlReturn_t (c_uint).
    unsafe {
        let lib = libloading::Library::new(&path).expect("load fake");
        for name in ["nvmlDeviceGetHostname_v1", "nvmlSystemGetCPER_v1"] {
            let f: libloading::Symbol<unsafe extern "C" fn() -> u32> =
                lib.get(name.as_bytes()).expect(name);
            assert_eq!(f(), 3, "{name} → NVML_ERROR_NOT_SUPPORTED");
        }
    }
}
