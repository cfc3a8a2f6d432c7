//! Sparse decode attention with the tier decided on the device, at
//! scaled-down sizes (dense up to 64 tokens, top-16, indexer chunks of 16
//! up to 128 tokens and of 32 up to 512): the outputs and the selections
//! match the f64 reference on the shim and in semantic time, bit-identical
//! between the two; each tier runs the tasks it should; a length above the
//! last tier is refused before the run, naming the request.

use device_runtime::sched::RunOptions;
use host_tools::attention::sparse::{
    sparse_workload, task_count, Path, SparseData, SparseShape, Tier, Tiers,
};
use host_tools::attention::DecodeShape;
use host_tools::semantic::{run_semantic, SemanticRun};
use host_tools::shim::Shim;
use host_tools::table::Arena;
use host_tools::workloads::{Params, Workload, WorkloadError};
use wsp_ffi::{
    CoreKind, WspKernelId_WSP_KERNEL_ATTN_DECODE_PARTIAL as PARTIAL,
    WspKernelId_WSP_KERNEL_ATTN_SPARSE_PARTIAL as SPARSE,
    WspKernelId_WSP_KERNEL_INDEXER_SCORES as INDEXER, WspKernelId_WSP_KERNEL_TOPK as TOPK,
};

fn tiers() -> Tiers {
    Tiers {
        dense_max: 64,
        k_max: 16,
        sparse: vec![
            Tier {
                longest: 128,
                chunk: 16,
            },
            Tier {
                longest: 512,
                chunk: 32,
            },
        ],
    }
}

fn shape(lengths: &[u32]) -> SparseShape {
    SparseShape {
        decode: DecodeShape {
            lengths: lengths.to_vec(),
            q_heads: 8,
            kv_heads: 2,
            d: 32,
            page: 16,
        },
        index_heads: 4,
        index_dim: 16,
        tiers: tiers(),
    }
}

const KINDS: [CoreKind; 6] = [
    CoreKind::Cube,
    CoreKind::Cube,
    CoreKind::Cube,
    CoreKind::Vector,
    CoreKind::Vector,
    CoreKind::Vector,
];

/// Runs `w` in semantic time and on the shim, asserts their `out` and
/// `meta` bytes equal and the check passes; returns the semantic run.
fn run_both(w: &Workload) -> (SemanticRun, Arena) {
    let mut semantic = w.arena.clone();
    let run = run_semantic(
        &w.table,
        &mut semantic.bytes,
        &KINDS,
        &RunOptions::default(),
    )
    .unwrap();
    let mut threads = w.arena.clone();
    let shim = Shim {
        cube_cores: 3,
        vector_cores: 3,
        ..Shim::default()
    };
    shim.run(&w.table, &mut threads.bytes).unwrap();
    for name in ["out", "meta"] {
        let t = w.tensors.iter().find(|l| l.name == name).unwrap();
        let at = t.arena_offset as usize;
        let len = 4 * t.elements();
        assert!(
            semantic.bytes[at..at + len] == threads.bytes[at..at + len],
            "{name}: semantic time and the shim differ"
        );
    }
    let v = w.verify(&semantic);
    assert!(v.passed(), "{v}");
    let v = w.verify(&threads);
    assert!(v.passed(), "{v}");
    (run, semantic)
}

/// Tasks of the run per kernel: (dense partials, indexer, topk, sparse
/// partials).
fn per_kernel(run: &SemanticRun) -> [usize; 4] {
    let n = |k: u32| run.launches.iter().filter(|l| l.kernel_id == k).count();
    [n(PARTIAL), n(INDEXER), n(TOPK), n(SPARSE)]
}

#[test]
fn a_mixed_batch_matches_the_reference_bit_identical_on_shim_and_semantic() {
    let lengths = [1, 64, 65, 300, 17, 128, 129, 512];
    let data = SparseData::build(shape(&lengths), 3).unwrap();
    let w = sparse_workload("sparse-decode", &data).unwrap();
    let (run, _) = run_both(&w);
    assert_eq!(run.stats.tasks as usize, w.tasks);
    assert_eq!(Ok(w.tasks), task_count(&tiers(), &lengths, 2));
    // 3 dense requests x 2 KV heads; 5 sparse ones: chunks of 16 for 65
    // and 128 (5 + 8), of 32 for 129, 300 and 512 (5 + 10 + 16).
    assert_eq!(per_kernel(&run), [6, 5 + 8 + 5 + 10 + 16, 5, 10]);
}

#[test]
fn each_tier_is_taken_and_the_bounds_fall_on_the_right_side() {
    // (length, path, indexer chunks)
    let cases = [
        (1, Path::Dense, 0),
        (64, Path::Dense, 0),
        (65, Path::Sparse { tier: 0 }, 5),
        (128, Path::Sparse { tier: 0 }, 8),
        (129, Path::Sparse { tier: 1 }, 5),
        (512, Path::Sparse { tier: 1 }, 16),
    ];
    for (len, path, chunks) in cases {
        assert_eq!(tiers().path(len), Some(path), "{len}");
        let data = SparseData::build(shape(&[len]), 7).unwrap();
        let w = sparse_workload("sparse-decode", &data).unwrap();
        let (run, arena) = run_both(&w);
        let want = match path {
            Path::Dense => [2, 0, 0, 0],
            Path::Sparse { .. } => [0, chunks, 1, 2],
        };
        assert_eq!(per_kernel(&run), want, "length {len}");
        if let Path::Sparse { .. } = path {
            // The device selected 16 positions, increasing, all < len.
            let meta = w.tensors.iter().find(|l| l.name == "meta").unwrap();
            let meta = arena.read_i32(meta);
            let width = meta.len() / 2;
            let row = &meta[width..width + 16];
            assert!(row.windows(2).all(|p| p[0] < p[1]), "{row:?}");
            assert!(row.iter().all(|&p| p >= 0 && (p as u32) < len), "{row:?}");
            assert!(meta[width + 16..].iter().all(|&p| p == -1));
        }
    }
    assert_eq!(tiers().path(513), None);
}

#[test]
fn the_check_catches_a_wrong_selection_and_a_wrong_output() {
    let data = SparseData::build(shape(&[40, 200]), 9).unwrap();
    let w = sparse_workload("sparse-decode", &data).unwrap();
    let (_, good) = run_both(&w);
    let meta = w.tensors.iter().find(|l| l.name == "meta").unwrap().clone();
    let out = w.tensors.iter().find(|l| l.name == "out").unwrap().clone();
    // Swap one selected position of request 1 for an unselected one.
    let mut bad = good.clone();
    let mut m = bad.read_i32(&meta);
    let width = m.len() / 4;
    let row = 3 * width;
    let unselected = (0..200).find(|p| !m[row..row + 16].contains(p)).unwrap();
    m[row] = unselected;
    bad.write_i32(&meta, &m);
    let v = w.verify(&bad);
    assert!(!v.passed(), "{v}");
    assert!(v.output.contains("request 1"), "{v}");
    // Nudge one output element of the dense request.
    let mut bad = good.clone();
    let mut o = bad.read_f32(&out);
    o[3] += 1e-3;
    bad.write_f32(&out, &o);
    let v = w.verify(&bad);
    assert!(!v.passed(), "{v}");
}

#[test]
fn a_length_above_the_last_tier_is_refused_naming_the_request() {
    let e = SparseData::build(shape(&[10, 512, 513]), 1).unwrap_err();
    assert!(matches!(e, WorkloadError::Params(_)), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("request 2") && msg.contains("513"), "{msg}");
    // Bad tiers are refused too.
    let mut s = shape(&[10]);
    s.tiers.k_max = 4096;
    assert!(SparseData::build(s, 1)
        .unwrap_err()
        .to_string()
        .contains("k_max"));
    let mut s = shape(&[10]);
    s.tiers.sparse[1].longest = 20000;
    assert!(SparseData::build(s, 1)
        .unwrap_err()
        .to_string()
        .contains("16384"));
}

#[test]
fn the_sparse_program_refuses_data_its_check_refuses() {
    use host_tools::attention::sparse::sparse_program;
    // Lengths edited to u32::MAX and 1: their u32 sum, the keys' rows,
    // once overflowed in sparse_program, which did not check its data;
    // the check names the request past the last tier (512 tokens).
    let mut data = SparseData::build(shape(&[10, 20]), 1).unwrap();
    data.shape.decode.lengths = vec![u32::MAX, 1];
    let e = sparse_program(&data).err().unwrap().to_string();
    assert!(e.contains("request 0: KV length 4294967295 exceeds"), "{e}");
}

#[test]
fn non_finite_indexer_data_is_refused_naming_the_element() {
    use host_tools::attention::sparse::{select, sparse_workload_with};
    // Requests of 40 (dense) and 200 (sparse) tokens: request 1's keys
    // start at row 40 of `keys`; H = 4 indexer heads of Dq = 16.
    let data = SparseData::build(shape(&[40, 200]), 5).unwrap();
    assert_eq!(data.start, [0, 40]);
    assert!(data.check().is_ok());
    // Its 6th key (row 40 + 5 = 45), column 0: the score's own column.
    let mut bad = data.clone();
    bad.keys[45 * 16] = f32::NAN;
    let want =
        "keys row 45 column 0 is NaN (the indexer's queries, weights and keys must be finite)";
    for e in [
        bad.check().unwrap_err(),
        sparse_workload("sparse-decode", &bad).err().unwrap(),
        select(&bad, 1).unwrap_err(),
    ] {
        assert!(matches!(e, WorkloadError::Params(_)), "{e}");
        assert!(e.to_string().contains(want), "{e}");
    }
    // Request 1's head 2 weight: iw is [B, H], element 1 * 4 + 2.
    let mut bad = data.clone();
    bad.iw[4 + 2] = f32::INFINITY;
    let e = sparse_workload("sparse-decode", &bad).err().unwrap();
    assert!(e.to_string().contains("iw row 1 column 2 is inf"), "{e}");
    // Request 1's head 3 query, column 7: iq is [B * H, Dq], row 1 * 4 + 3.
    let mut bad = data.clone();
    bad.iq[(4 + 3) * 16 + 7] = f32::NEG_INFINITY;
    let e = sparse_workload("sparse-decode", &bad).err().unwrap();
    assert!(e.to_string().contains("iq row 7 column 7 is -inf"), "{e}");
    // The reference's own data is checked when the check runs: a run
    // checked against a NaN key fails naming it, not as an ambiguous top-k.
    let mut bad = data.clone();
    bad.keys[45 * 16] = f32::NAN;
    let w = sparse_workload_with("sparse-decode", &data, move || bad.clone()).unwrap();
    let v = w.verify(&w.arena);
    assert!(!v.passed());
    assert!(v.output.contains("keys row 45 column 0 is NaN"), "{v}");
    // Buffers that do not match the shape, or offsets past the keys, are
    // refused instead of read past their end: 240 keys in all.
    let mut bad = data.clone();
    bad.keys.truncate(239 * 16);
    let e = sparse_workload("sparse-decode", &bad).err().unwrap();
    assert!(e.to_string().contains("keys holds 3824 values"), "{e}");
    let mut bad = data.clone();
    bad.start[1] = 41;
    let e = select(&bad, 1).unwrap_err();
    assert!(
        e.to_string()
            .contains("request 1: its 200 indexer keys from row 41"),
        "{e}"
    );
    assert!(select(&data, 2).is_err());
}

#[test]
fn the_named_workload_mixes_tiers_and_refuses_a_longer_request() {
    let p = Params::of("sparse-decode").unwrap();
    assert_eq!((p.m, p.n), (8, 16384));
    let lengths = host_tools::attention::sparse::lengths_of(p.m, p.n, &Tiers::full());
    assert!(lengths.contains(&16384) && lengths.contains(&2048) && lengths.contains(&2049));
    let e = Workload::build("sparse-decode", Params { n: 16385, ..p })
        .err()
        .unwrap();
    assert!(e.to_string().contains("request 0"), "{e}");
}

/// Runs `w` in semantic time with row 0 of `lens` (the lengths the
/// program reads) replaced by `lengths`.
fn run_with_lengths(w: &Workload, lengths: &[i32]) -> Result<SemanticRun, String> {
    let lens = w.tensors.iter().find(|l| l.name == "lens").unwrap();
    let mut arena = w.arena.clone();
    let mut v = arena.read_i32(lens);
    v[..lengths.len()].copy_from_slice(lengths);
    arena.write_i32(lens, &v);
    run_semantic(&w.table, &mut arena.bytes, &KINDS, &RunOptions::default())
        .map_err(|e| e.to_string())
}

#[test]
fn the_tier_is_decided_on_the_device_from_the_lengths_it_reads() {
    // Built for 200 tokens (tier 1: 7 chunks of 32); the device reads other
    // lengths and takes their tiers, with the same table.
    let data = SparseData::build(shape(&[200]), 2).unwrap();
    let w = sparse_workload("sparse-decode", &data).unwrap();
    let counts = |len: i32| per_kernel(&run_with_lengths(&w, &[len]).unwrap());
    assert_eq!(counts(200), [0, 7, 1, 2]);
    assert_eq!(counts(128), [0, 8, 1, 2], "tier 0: chunks of 16");
    assert_eq!(counts(60), [2, 0, 0, 0], "dense");
    // A length above the last tier, only on the device: its indexer loop
    // asks for 17 chunks where the program allows 16: the run ends.
    let big = SparseData::build(shape(&[512, 100]), 2).unwrap();
    let w = sparse_workload("sparse-decode", &big).unwrap();
    let e = run_with_lengths(&w, &[513]).unwrap_err();
    assert!(e.contains("loop count 17 outside [0, 16]"), "{e}");
}

/// The release-size run: k = 2,048, one 16K request among dense and
/// sparse ones (a release build runs it; CI's release-size step too).
#[test]
#[cfg_attr(debug_assertions, ignore = "release size: run with --release")]
fn release_size_sparse_decode() {
    let w = Workload::build("sparse-decode", Params::of("sparse-decode").unwrap()).unwrap();
    let (run, _) = run_both(&w);
    assert_eq!(run.stats.tasks as usize, w.tasks);
}

#[test]
fn counts_and_lengths_of_unchecked_tiers_do_not_panic() {
    let mut t = Tiers {
        dense_max: 4,
        k_max: 2,
        sparse: vec![Tier {
            longest: 10,
            chunk: 3,
        }],
    };
    // 2 KV heads. 4 tokens: dense, 2 partials; 10: sparse, ceil(10 / 3) = 4
    // indexer chunks, 1 topk, 2 partials; 11: no tier, 0.
    assert_eq!(task_count(&t, &[4, 10, 11], 2), Ok(9));
    // An indexer chunk of 0 keys (once a division by 0).
    t.sparse[0].chunk = 0;
    let e = task_count(&t, &[10], 2).unwrap_err();
    assert!(e.contains("indexer chunk of 0 keys"), "{e}");
    // A dense tier up to u32::MAX has no length above it (once an
    // overflow): 10 and 1, then 10^(1/4) = 1.78, rounded to 2.
    let t = Tiers {
        dense_max: u32::MAX,
        k_max: 2,
        sparse: vec![],
    };
    assert_eq!(
        host_tools::attention::sparse::lengths_of(3, 10, &t),
        [10, 1, 2]
    );
}

#[test]
fn the_two_copies_of_the_sizes_must_agree() {
    // shape.decode (the indexer's) and attn.shape (the attention's) are
    // the same sizes twice; an edit of one alone is named, not read as
    // buffers of the wrong size.
    let data = SparseData::build(shape(&[40, 200]), 5).unwrap();
    let mut bad = data.clone();
    bad.shape.decode.lengths[1] = 199;
    let e = bad.check().unwrap_err().to_string();
    assert!(
        e.contains("shape.decode and attn.shape differ (request 1: KV length 199 against 200)"),
        "{e}"
    );
    let mut bad = data.clone();
    bad.shape.decode.lengths.push(7);
    let e = bad.check().unwrap_err().to_string();
    assert!(e.contains("(3 requests against 2)"), "{e}");
}
