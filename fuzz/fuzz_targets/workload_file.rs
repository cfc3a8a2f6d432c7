//! The TOML workload file: parse arbitrary text, and build what parses
//! with every symbol at its default. Errors are fine; panics are not.
#![no_main]

use host_tools::workload_file::WorkloadFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(file) = WorkloadFile::parse(text) {
        let _ = file.build(&[]);
    }
});
