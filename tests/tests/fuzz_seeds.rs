//! The fuzz targets' seed corpus (`fuzz/corpus/TARGET/seed-*`): real tables
//! (the built-in workloads at small sizes, the program examples, the
//! example workload files), the example workload files' text and launch
//! blocks. `WSP_WRITE_FUZZ_SEEDS=1 cargo test -p wsp-tests --test
//! fuzz_seeds` writes them; a plain run checks that the checked-in seeds
//! are what the current code builds, so that a change of the table format
//! says to write them again.

use std::path::{Path, PathBuf};

use device_runtime::abi::launch::Symbols;
use device_runtime::abi::launch::{Launch, LAUNCH_MAX};
use device_runtime::abi::Table;
use device_runtime::sched::PolicyKind;
use host_tools::program_examples;
use host_tools::workload_file::WorkloadFile;
use host_tools::workloads::{Params, Workload, NAMES};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// (target, file name, bytes) of every seed.
fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut table = |name: String, bytes: Vec<u8>| {
        Table::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        out.push(("table", name.clone(), bytes.clone()));
        out.push(("expand", name, bytes));
    };
    for name in NAMES {
        // The first seed whose routing is clear of ties (for the MoE ones).
        let w = (1..50)
            .find_map(|seed| {
                // The pipelines have sizes of their own (square tiles),
                // v9's examples fixed ones: their defaults, which give
                // small tables too.
                let p = if name.contains("pipeline") || name.starts_with("wsp9-") {
                    Params {
                        seed,
                        ..Params::of(name).unwrap()
                    }
                } else {
                    Params {
                        m: 64,
                        n: 64,
                        k: 64,
                        tile: 32,
                        seed,
                    }
                };
                Workload::build(name, p).ok()
            })
            .unwrap();
        table(format!("seed-{name}"), w.table);
    }
    let examples = [
        ("dense_dyn", program_examples::dense_dyn()),
        ("ragged", program_examples::ragged()),
        ("column_seq", program_examples::column(true)),
        ("column_par", program_examples::column(false)),
    ];
    for (name, mut ex) in examples {
        table(format!("seed-{name}"), ex.w.finish().unwrap());
    }
    let mut files = Vec::new();
    let dir = root().join("examples/workloads");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let built = WorkloadFile::parse(&text).unwrap().build(&[]).unwrap();
        table(format!("seed-file-{stem}"), built.table);
        files.push((format!("seed-{stem}.toml"), text.into_bytes()));
    }
    for (name, text) in files {
        out.push(("workload_file", name, text));
    }
    let launches = [
        (
            "none",
            Launch {
                symbols: Symbols::default(),
                threads: None,
                policy: None,
            },
        ),
        (
            "symbols",
            Launch {
                symbols: Symbols::new(&[4, 1, 0, 7]).unwrap(),
                threads: Some(2),
                policy: Some(PolicyKind::WorkStealing),
            },
        ),
    ];
    for (name, launch) in launches {
        let mut block = [0u8; LAUNCH_MAX];
        let len = launch.write(&mut block).unwrap();
        out.push(("launch", format!("seed-{name}"), block[..len].to_vec()));
    }
    out
}

#[test]
fn the_fuzz_seed_corpus_is_current() {
    let write = std::env::var_os("WSP_WRITE_FUZZ_SEEDS").is_some();
    let mut total = 0;
    for (target, name, bytes) in seeds() {
        let path = root().join("fuzz/corpus").join(target).join(&name);
        total += bytes.len();
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        } else {
            let stored = std::fs::read(&path).unwrap_or_default();
            assert!(
                stored == bytes,
                "{target}/{name} is stale: WSP_WRITE_FUZZ_SEEDS=1 cargo test -p wsp-tests --test fuzz_seeds"
            );
        }
    }
    assert!(total < 1 << 20, "the seeds take {total} bytes");
}
