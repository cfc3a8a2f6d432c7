//! The transformer decode layer (`decode-layer-dense`): the whole step
//! (two layers, variable KV lengths) on the shim and in semantic time
//! against the f64 reference and its running bound; its task count from
//! the sizes; checks that fail when the run is wrong; refused sizes.

use device_runtime::sched::RunOptions;
use host_tools::model::layer::{shape_of, task_count, LayerShape};
use host_tools::model::{decode_layer_workload, reference, LayerData, Mlp};
use host_tools::moe_layer::MoeConfig;
use host_tools::semantic::run_semantic;
use host_tools::shim::Shim;
use host_tools::workloads::{Params, Workload};
use wsp_ffi::CoreKind;

fn params(m: u32, n: u32, k: u32) -> Params {
    Params {
        m,
        n,
        k,
        tile: 16,
        seed: 3,
    }
}

fn small() -> LayerData {
    let p = params(6, 65, 128);
    LayerData::build(shape_of(&p, Mlp::Dense).unwrap(), p.seed).unwrap()
}

fn run_shim(w: &Workload) -> host_tools::table::Arena {
    let mut arena = w.arena.clone();
    let stats = Shim::default().run(&w.table, &mut arena.bytes).unwrap();
    assert_eq!(stats.tasks as usize, w.tasks, "tasks run vs counted");
    arena
}

#[test]
fn the_step_matches_the_reference_on_the_shim_and_in_semantic_time() {
    let data = small();
    // Lengths 1, 2, 3, 63, 64, 65: one token (only the appended one), a
    // page boundary either side.
    assert_eq!(data.shape.lengths, [1, 2, 3, 63, 64, 65]);
    let w = decode_layer_workload("decode-layer-dense", &data).unwrap();
    let shim = run_shim(&w);
    let check = w.verify(&shim);
    assert!(check.passed(), "{check}");
    // 6 requests x 128 hidden, plus 2 layers x 6 requests x 1 KV head x
    // (key + value) x 64.
    assert_eq!(check.elements, 6 * 128 + 2 * 6 * 2 * 64);
    let mut sem = w.arena.clone();
    let kinds = [
        CoreKind::Cube,
        CoreKind::Cube,
        CoreKind::Vector,
        CoreKind::Vector,
    ];
    let run = run_semantic(&w.table, &mut sem.bytes, &kinds, &RunOptions::default()).unwrap();
    assert_eq!(run.stats.tasks as usize, w.tasks);
    let check = w.verify(&sem);
    assert!(check.passed(), "semantic: {check}");
    // The same kernels on the same inputs in a different order of
    // independent tasks: the same bits.
    assert!(sem.bytes == shim.bytes, "shim and semantic arenas differ");
}

#[test]
fn tasks_are_counted_from_the_sizes() {
    let data = small();
    // Per layer, hidden 128 (2 tiles), QKV 2 + 2 x 1 heads of 64 = 256 (4
    // tiles), ffn 256 (4 tiles), 6 requests (1 norm block):
    // norms 2, QKV 4 x 2, rope and append 6 x (1 + 2), o gathers 6,
    // residual copies 2 + 2, o-proj 2 x 2, gate and up 2 x 4 x 2,
    // silu_mul 4, down 2 x 4 = 72 + attention. The chunk for these
    // lengths (all under the 128-token least chunk) is no split: 6 partials.
    let per_layer = 2 + 8 + 18 + 6 + 4 + 4 + 16 + 4 + 8 + 6;
    assert_eq!(task_count(&data).unwrap(), 1 + 2 * per_layer);
    // A shape edited past its check is refused, naming the size, not a
    // panic in the planner or the MoE count: pages of 0 tokens ...
    let mut bad = small();
    bad.shape.page = 0;
    let why = task_count(&bad).unwrap_err().to_string();
    assert!(why.contains("page"), "{why}");
    // ... and an MoE tile of 0 rows (no padding unit to divide by).
    let mut bad = small_moe(0.0, 2);
    let Mlp::Moe(cfg) = bad.shape.mlp else {
        unreachable!("small_moe is an MoE layer")
    };
    bad.shape.mlp = Mlp::Moe(host_tools::moe_layer::MoeConfig { tile: 0, ..cfg });
    let why = task_count(&bad).unwrap_err().to_string();
    assert!(why.contains("tile = 0"), "{why}");
}

#[test]
fn buffers_that_do_not_fit_the_shape_are_refused_naming_them() {
    // small(): 6 requests, hidden 128, QKV 256, ffn 256, 1 KV head of 64,
    // pages of 16. Lengths 1, 2, 3, 63, 64 and 65 take 1 + 1 + 1 + 4 + 4
    // + 5 = 16 pages, so the pool has 16 x 2 x 16 = 512 rows of 64.
    type Edit = fn(&mut LayerData);
    let dense: [(Edit, &str); 9] = [
        (
            |d| {
                d.layers[1].wo.pop();
            },
            "layer 1: wo holds 16383 values; its shape takes 128 rows of 128, 16384",
        ),
        (
            |d| {
                d.layers[0].kv.truncate(100);
            },
            "layer 0: kv holds 100 values; its shape takes 512 rows of 64, 32768",
        ),
        (
            |d| d.x.extend([0.0; 128]),
            "x holds 896 values; its shape takes 6 rows of 128, 768",
        ),
        // Row 2, column 5 of [6, 128]: value 2 x 128 + 5 = 261.
        (|d| d.x[261] = f32::NAN, "x row 2 column 5 is NaN"),
        // wd is [256, 128]: value 300 is row 2, column 44.
        (
            |d| d.layers[1].wd[300] = f32::INFINITY,
            "layer 1: wd row 2 column 44 is inf",
        ),
        (
            |d| {
                d.layers.pop();
            },
            "1 layers of weights for a shape of 2 layers",
        ),
        (
            |d| d.cs.clear(),
            "cs holds 0 values; its shape takes 65 positions of 64, 4160",
        ),
        // Request 0's one page named as page 16 of the 16 (0 ..= 15).
        (
            |d| d.meta[0] = 16,
            "request 0: page table entry 0 is page 16, outside the pool's 16 pages",
        ),
        (
            |d| d.layers[0].moe = small_moe(0.0, 2).layers[0].moe.clone(),
            "layer 0: MoE weights for a dense shape",
        ),
    ];
    for (edit, says) in dense {
        let mut data = small();
        edit(&mut data);
        // Where the task count checks the shape, and where a program is
        // declared: refused, naming the buffer, not an index out of bounds.
        let e = task_count(&data).unwrap_err().to_string();
        assert!(e.contains(says), "{says}: {e}");
        let e = decode_layer_workload("decode-layer-dense", &data)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(says), "{says}: {e}");
    }
    // The MoE block: 8 experts of ffn 64 and a shared expert of 64 over
    // hidden 128. A router short of a value once made the task count's
    // reference index past it.
    let moe: [(Edit, &str); 3] = [
        (
            |d| {
                d.layers[0].moe.as_mut().unwrap().router.pop();
            },
            "layer 0: router holds 1023 values; its shape takes 128 rows of 8, 1024",
        ),
        (
            |d| {
                d.layers[1].moe.as_mut().unwrap().down.truncate(8);
            },
            "layer 1: down holds 8 values; its shape takes 512 rows of 128, 65536",
        ),
        (
            |d| d.layers[1].wg = vec![0.0; 128 * 64],
            "layer 1: wg holds 8192 values; an MoE layer has no dense weights",
        ),
    ];
    for (edit, says) in moe {
        let mut data = small_moe(0.0, 2);
        edit(&mut data);
        let e = task_count(&data).unwrap_err().to_string();
        assert!(e.contains(says), "{says}: {e}");
    }
    let mut data = small_moe(0.0, 2);
    data.layers[0].moe = None;
    let e = task_count(&data).unwrap_err().to_string();
    assert!(
        e.contains("layer 0: an MoE shape without MoE weights"),
        "{e}"
    );
    // The reference refuses such data too, rather than indexing past it.
    let mut data = small();
    data.layers[1].wo.pop();
    let e = reference::step(&data).unwrap_err().to_string();
    assert!(e.contains("layer 1: wo holds 16383 values"), "{e}");
    // The data as built passes.
    small().check().unwrap();
    small_moe(0.0, 2).check().unwrap();
}

#[test]
fn sizes_whose_products_pass_32_bits_are_refused_not_wrapped() {
    // 2^25 query heads of 128 on 1 KV head: hidden = 2^25 x 2^7 = 2^32,
    // which overflowed u32 in LayerShape::check (before any size was
    // checked), in the workload's summary and in heap_bytes.
    let mut data = small();
    data.shape.q_heads = 1 << 25;
    data.shape.d = 128;
    let e = data.shape.check().unwrap_err().to_string();
    assert!(e.contains("a GQA group above 16"), "{e}");
    let summary = host_tools::model::layer::summary_of(&data);
    assert!(summary.contains("hidden 4294967296"), "{summary}");
    let e = host_tools::model::layer::heap_bytes(&data).unwrap_err();
    assert!(e.to_string().contains("a GQA group above 16"), "{e}");
    let e = decode_layer_workload("decode-layer-dense", &data)
        .err()
        .unwrap();
    assert!(e.to_string().contains("a GQA group above 16"), "{e}");
    // With 2^25 KV heads too (a group of 1) the hidden size's check is
    // reached, and names it exactly: 2^25 x 128 = 4294967296.
    let mut shape = small().shape;
    shape.q_heads = 1 << 25;
    shape.kv_heads = 1 << 25;
    shape.d = 128;
    let e = shape.check().unwrap_err().to_string();
    assert!(
        e.contains("hidden size 4294967296 (q_heads x d) must be a multiple of 64 up to 1024"),
        "{e}"
    );
    // An MoE block's weights for a config past its check: 64 experts x
    // 1024 hidden x (2^32 - 1) overflowed u32.
    let cfg = host_tools::moe_layer::MoeConfig {
        tokens: 1,
        hidden: 1024,
        ffn: u32::MAX,
        experts: 64,
        top_k: 1,
        threshold: 0.0,
        tile: 1,
        shared_ffn: 0,
    };
    let mut rng = host_tools::rng::SplitMix64::new(1);
    let e = host_tools::model::layer::moe_weights(&mut rng, &cfg)
        .err()
        .unwrap();
    assert!(e.to_string().contains("ffn = 4294967295"), "{e}");
    // Stitched steps are prefixed a. to z.: 27 would take `{.` (and the
    // 160th's prefix overflowed u8), none has nothing to run.
    use host_tools::model::layer::stitched_workload;
    for n in [0, 27] {
        let steps = vec![small(); n];
        let e = stitched_workload("stitched", &steps, String::new())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(&format!(
                "{n} steps: a stitched workload takes 1 ..= 26 (prefixes a. to z.)"
            )),
            "{e}"
        );
    }
}

#[test]
fn the_most_chunks_of_a_huge_page_table_do_not_overflow() {
    // A table of u32::MAX pages of 16 (no check would pass it) needs
    // ceil((2^32 - 1) 16 / 128) = 2^29 chunks of at least 128 tokens, as
    // 2^32 - 1 = 8 (2^29 - 1) + 7; W P itself overflows u32.
    let mut data = small();
    data.shape.page = 16;
    data.width = u32::MAX;
    assert_eq!(data.max_chunks(), 1 << 29);
}

#[test]
fn a_wrong_page_table_fails_the_check() {
    // The reference reads the cache through the page tables it was built
    // with. Request 5 has 65 tokens on 5 pages, the last holding only the
    // new token; a run whose table swaps its first and last pages appends
    // into the first and attends to 15 rows past the request's tokens, and
    // the check must see it. (Swapping two full pages would only reorder
    // the tokens, which attention does not see.)
    let data = small();
    let w = decode_layer_workload("decode-layer-dense", &data).unwrap();
    let meta = w
        .tensors
        .iter()
        .find(|t| t.name == "meta")
        .expect("a meta tensor")
        .clone();
    let mut arena = w.arena.clone();
    let mut m = arena.read_i32(&meta);
    let row = 5 * 2 * data.width as usize;
    m.swap(row, row + 4);
    arena.write_i32(&meta, &m);
    Shim::default().run(&w.table, &mut arena.bytes).unwrap();
    let check = w.verify(&arena);
    assert!(!check.passed(), "{check}");
}

#[test]
fn a_cos_sin_cache_one_position_off_fails_the_check() {
    // The reference computes each angle from the position; a run whose
    // cache rows are those of the next position rotates every query and
    // new key wrongly.
    let data = small();
    let w = decode_layer_workload("decode-layer-dense", &data).unwrap();
    let cs = w.tensors.iter().find(|t| t.name == "cs").unwrap().clone();
    let mut arena = w.arena.clone();
    let next = host_tools::model::layer::cos_sin(66, 64).unwrap();
    arena.write_f32(&cs, &next[64..]);
    Shim::default().run(&w.table, &mut arena.bytes).unwrap();
    let check = w.verify(&arena);
    assert!(!check.passed(), "{check}");
    assert!(check.worst_error_over_bound > 10.0, "{check}");
}

#[test]
fn sizes_the_layer_cannot_take_are_refused() {
    let base = shape_of(&params(4, 100, 128), Mlp::Dense).unwrap();
    type Change = fn(&mut LayerShape);
    let cases: [(&str, Change); 7] = [
        ("257 requests", |s| s.lengths = vec![8; 257]),
        ("head dimension 63", |s| s.d = 63),
        ("not a whole number of groups", |s| s.kv_heads = 3),
        ("ffn 100", |s| s.ffn = 100),
        // The first multiple of 64 past MAX_FFN = 2^15.
        ("ffn 32832", |s| s.ffn = 32832),
        // 128 hidden x 2^25 would overflow u32 (2^32).
        ("ffn 33554432", |s| s.ffn = 1 << 25),
        ("0 layers", |s| s.layers = 0),
    ];
    for (what, change) in cases {
        let mut s = base.clone();
        change(&mut s);
        let e = LayerData::build(s, 1).expect_err(what).to_string();
        let key = what.split(' ').next_back().unwrap();
        assert!(e.contains(key), "{what}: {e}");
    }
    // MAX_FFN itself passes the shape's check.
    let mut largest = base.clone();
    largest.ffn = 32768;
    largest.check().unwrap();
    let e = Workload::build("decode-layer-dense", params(4, 100, 96))
        .err()
        .unwrap();
    assert!(e.to_string().contains("multiple of 64"), "{e}");
}

#[test]
fn a_run_on_more_cores_than_one_thread_drives() {
    // 24 cube and 48 vector cores (an Ascend 910B's), 36 per scheduler
    // thread: the run's statistics cover all 72 (they held 64 and
    // panicked before).
    let data = small();
    let w = decode_layer_workload("decode-layer-dense", &data).unwrap();
    let mut kinds = vec![CoreKind::Cube; 24];
    kinds.extend([CoreKind::Vector; 48]);
    let mut arena = w.arena.clone();
    let run = run_semantic(&w.table, &mut arena.bytes, &kinds, &RunOptions::default()).unwrap();
    assert_eq!(run.stats.cores().len(), 72);
    let tasks: u64 = run.stats.cores().iter().map(|c| c.tasks).sum();
    assert_eq!(tasks as usize, w.tasks);
    assert!(w.verify(&arena).passed());
}

fn small_moe(threshold: f32, top_k: u32) -> LayerData {
    let p = params(6, 65, 128);
    let cfg = host_tools::moe_layer::MoeConfig {
        tokens: 0,
        hidden: 0,
        ffn: 64,
        experts: 8,
        top_k,
        threshold,
        tile: 4,
        shared_ffn: 64,
    };
    LayerData::build(shape_of(&p, Mlp::Moe(cfg)).unwrap(), p.seed).unwrap()
}

#[test]
fn the_moe_layer_matches_the_reference_with_its_routing() {
    for (threshold, top_k) in [(0.0, 2), (0.2, 4)] {
        let data = small_moe(threshold, top_k);
        let routes = reference::step(&data).unwrap().routes;
        assert_eq!(routes.len(), 2, "one routing per layer");
        let kept: Vec<usize> = routes[0].iter().map(|r| r.experts.len()).collect();
        if threshold == 0.0 {
            assert!(kept.iter().all(|&k| k == 2), "{kept:?}");
        } else {
            // Variable k: the threshold keeps between 0 and 4.
            assert!(kept.iter().all(|&k| k <= 4), "{kept:?}");
        }
        let w = decode_layer_workload("decode-layer", &data).unwrap();
        let shim = run_shim(&w);
        let check = w.verify(&shim);
        assert!(check.passed(), "threshold {threshold}: {check}");
        let mut sem = w.arena.clone();
        let kinds = [
            CoreKind::Cube,
            CoreKind::Cube,
            CoreKind::Vector,
            CoreKind::Vector,
        ];
        run_semantic(&w.table, &mut sem.bytes, &kinds, &RunOptions::default()).unwrap();
        assert!(sem.bytes == shim.bytes, "shim and semantic arenas differ");
    }
}

#[test]
fn a_wrong_router_fails_the_moe_check() {
    // The reference routes with the router it was built with; a run whose
    // router differs chooses other experts for some tokens.
    let data = small_moe(0.0, 2);
    let w = decode_layer_workload("decode-layer", &data).unwrap();
    let router = w
        .tensors
        .iter()
        .find(|t| t.name == "m0.router")
        .unwrap()
        .clone();
    let mut arena = w.arena.clone();
    let mut r = arena.read_f32(&router);
    r.reverse();
    arena.write_f32(&router, &r);
    Shim::default().run(&w.table, &mut arena.bytes).unwrap();
    assert!(!w.verify(&arena).passed());
}

#[test]
fn intermediates_live_on_the_heap_ring() {
    // small(): 6 requests, hidden 128, QKV 256, 2 query heads of 64, ffn
    // 256, 2 layers. Per layer the scratch tensors hold xn 768, qkv 1536,
    // q 768, state 6 x 2 x 66 = 792, o, h, hn 768 each, gate, up, act
    // 1536 each: 10,776 floats = 43,104 bytes (43,136 in 64-byte blocks:
    // state rounds 3,168 up to 3,200); the stream between the layers, x1,
    // 3,072 more. The ring holds one layer's blocks, the layer's input
    // and output, and the largest block again (a block that would cross
    // the ring's end starts at its beginning): 43,136 + 2 x 3,072 +
    // 6,144 = 55,424 bytes. The arena saves the scratch tensors' blocks
    // less the ring: 2 x 43,136 + 3,072 - 55,424 = 33,920.
    let data = small();
    let w = decode_layer_workload("decode-layer-dense", &data).unwrap();
    let mut arena = w.arena.clone();
    let stats = Shim::default().run(&w.table, &mut arena.bytes).unwrap();
    assert!(w.verify(&arena).passed());
    let heap = host_tools::summary::heap_figures(&stats).expect("scratch tensors");
    assert_eq!(heap.capacity, 55_424);
    assert_eq!(heap.scratch_bytes, 2 * 43_136 + 3_072);
    assert_eq!(heap.arena_saved, 33_920);
    assert!(heap.high_water <= heap.capacity && heap.high_water > 43_104);
}

#[test]
fn four_layers_through_a_small_window_and_a_wrapping_ring() {
    // Four layers wrap the heap ring; a 32-task window keeps the
    // expander close behind the cores. The ring's size (model::layer::
    // heap_bytes) must leave room for a block that cannot cross its end.
    let p = params(6, 65, 128);
    let shape = host_tools::model::LayerShape {
        layers: 4,
        ..shape_of(&p, Mlp::Dense).unwrap()
    };
    let data = LayerData::build(shape, 5).unwrap();
    let w = decode_layer_workload("decode-layer-dense", &data).unwrap();
    let mut arena = w.arena.clone();
    let kinds = [
        CoreKind::Cube,
        CoreKind::Cube,
        CoreKind::Vector,
        CoreKind::Vector,
    ];
    let options = RunOptions {
        window: Some(32),
        ..RunOptions::default()
    };
    let run = run_semantic(&w.table, &mut arena.bytes, &kinds, &options).unwrap();
    assert_eq!(run.stats.tasks as usize, w.tasks);
    let check = w.verify(&arena);
    assert!(check.passed(), "{check}");
}

#[test]
fn the_cos_sin_cache_refuses_a_head_dimension_rope_cannot_pair() {
    use host_tools::model::layer::cos_sin;
    // D = 2: one pair, angle p * theta^0 = p: [cos p, sin p] per position.
    let want = [1.0, 0.0, 1f64.cos() as f32, 1f64.sin() as f32];
    assert_eq!(cos_sin(2, 2).unwrap(), want);
    // D = 0 once panicked; an odd D left its last column 0.
    for d in [0, 3] {
        let e = cos_sin(2, d).unwrap_err().to_string();
        assert!(
            e.contains(&format!("head dimension {d} must be even")),
            "{e}"
        );
    }
}

#[test]
fn a_deep_step_declares_two_layers_of_scratch_tensors_and_matches_the_reference() {
    // Layers 0 and 1 declare their intermediates, 10 each in a dense
    // layer (xn, qkv, q, state, o, h, hn, gate, up, act), and the stream
    // between layers is two tensors (x1, x2); layer l from 2 on reuses
    // layer l - 2's: 22 scratch tensors for any depth past 2, where each
    // layer declaring its own took 10 L + L - 1 (87 at 8 layers).
    let p = params(6, 65, 128);
    let shape = host_tools::model::LayerShape {
        layers: 8,
        ..shape_of(&p, Mlp::Dense).unwrap()
    };
    let data = LayerData::build(shape, 7).unwrap();
    let w = decode_layer_workload("decode-layer-dense", &data).unwrap();
    let table = device_runtime::abi::Table::parse(&w.table).unwrap();
    let scratch = table.tensors().iter().filter(|t| t.is_scratch()).count();
    assert_eq!(scratch, 22);
    let arena = run_shim(&w);
    let check = w.verify(&arena);
    assert!(check.passed(), "{check}");
}

#[test]
fn an_moe_step_of_twelve_layers_passes_the_old_program_and_data_limits() {
    // The step loads one routing tensor per layer and three shared ones:
    // 12 + 3 = 15 data tensors, past the 8 (MAX_DATA_TENSORS) the device
    // used to track, which stopped an MoE model at 5 layers; and its
    // program is past the 4,096 instructions MAX_PROGRAM was (8 layers
    // took 4,461). Its scratch tensors are two layers' (7 of attention
    // and the MoE block's output each, and the stream's two): 18.
    let p = params(6, 65, 128);
    let moe = small_moe(0.0, 2).shape;
    let shape = host_tools::model::LayerShape { layers: 12, ..moe };
    let data = LayerData::build(shape, p.seed).unwrap();
    let w = decode_layer_workload("decode-layer", &data).unwrap();
    let table = device_runtime::abi::Table::parse(&w.table).unwrap();
    assert_eq!(table.program_info().data().len(), 12 + 3);
    assert!(table.program().len() > 4096, "{}", table.program().len());
    let scratch = table.tensors().iter().filter(|t| t.is_scratch()).count();
    assert_eq!(scratch, 18);
    let shim = run_shim(&w);
    let check = w.verify(&shim);
    assert!(check.passed(), "{check}");
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "24 layers of 16 requests: run with --release"
)]
fn a_deep_moe_step_needs_planted_routers_and_matches_the_reference() {
    // `wsp run decode-layer --k 128 --layers 24`. The logits' error bounds
    // grow with depth; with random router draws alone, the data builder
    // found no draw that cleared them at layer 18 (100 draws; layer 17
    // took 1,454), so this step exists only with planted routers
    // (`model::layer::plant`), and the run's f32 routing must still agree
    // with the f64 reference's at every layer for the check to pass.
    let p = Params {
        k: 128,
        ..Params::of("decode-layer").unwrap()
    };
    let w = Workload::decode_layers("decode-layer", p, 24).unwrap();
    let table = device_runtime::abi::Table::parse(&w.table).unwrap();
    assert_eq!(table.program_info().data().len(), 24 + 3);
    let arena = run_shim(&w);
    let check = w.verify(&arena);
    assert!(check.passed(), "{check}");
}

#[test]
fn the_layer_references_and_pool_rows_refuse_what_does_not_fit_the_shape() {
    use host_tools::model::reference::{attention_half, layer, Val};
    // 6 requests of lengths 1, 2, 3, 63, 64, 65 in pages of 16 (1 + 1 + 1
    // + 4 + 4 + 5 = 16 pages, tables 5 wide), 2 query heads and 1 KV head
    // of 64 (hidden 128, QKV (2 + 2) x 64 = 256), ffn 256.
    let data = small();
    let x = Val::exact(&data.x, 128);
    // Layer by layer through the checked entry points, as the step does.
    let one = layer(&data, &data.layers[0], &x).unwrap().0;
    let two = layer(&data, &data.layers[1], &one).unwrap().0;
    assert_eq!(two, reference::step(&data).unwrap().out);
    let (hres, ..) = attention_half(&data, &data.layers[0], &x).unwrap();
    assert_eq!(hres.v.len(), 6 * 128);

    // An x of 5 rows (it would be read past its end).
    let short = Val::exact(&data.x[..5 * 128], 128);
    let e = attention_half(&data, &data.layers[0], &short)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "x holds 640 values and 640 bounds in rows of 128; the shape takes 6 rows of 128, 768"
        ),
        "{e}"
    );
    // Weights of other sizes than the shape's.
    let mut lw = data.layers[0].clone();
    lw.wqkv.pop();
    let e = attention_half(&data, &lw, &x).unwrap_err().to_string();
    assert!(
        e.contains("the layer: wqkv holds 32767 values; its shape takes 128 rows of 256, 32768"),
        "{e}"
    );
    let mut lw = data.layers[1].clone();
    lw.wd.truncate(100);
    let e = layer(&data, &lw, &x).unwrap_err().to_string();
    assert!(
        e.contains("the layer: wd holds 100 values; its shape takes 256 rows of 128, 32768"),
        "{e}"
    );
    // A page table entry past the pool (it would index the cache past
    // its 16 x 32 rows).
    let mut bad = small();
    bad.meta[0] = 16;
    let says = "request 0: page table entry 0 is page 16, outside the pool's 16 pages";
    let e = layer(&bad, &bad.layers[0], &x).unwrap_err().to_string();
    assert!(e.contains(says), "{e}");
    let e = bad.pool_row(0, 0, false).unwrap_err().to_string();
    assert!(e.contains(says), "{e}");

    // pool_row: request 0's first page, key rows then value rows (16 each).
    let page = data.meta[0] as usize;
    assert_eq!(data.pool_row(0, 0, false).unwrap(), page * 32);
    assert_eq!(data.pool_row(0, 0, true).unwrap(), page * 32 + 16);
    let e = data.pool_row(6, 0, false).unwrap_err().to_string();
    assert!(e.contains("request 6 of a batch of 6"), "{e}");
    // Token 200's page would be entry 12 of a 5-wide table, past the
    // tables' 60 entries.
    let e = data.pool_row(5, 200, false).unwrap_err().to_string();
    assert!(
        e.contains("token 200 of request 5, past its 65 KV tokens"),
        "{e}"
    );
}

#[test]
fn the_routing_margin_check_refuses_sizes_not_of_its_config() {
    use host_tools::model::reference::{attention_half, decisive, Val};
    // 6 tokens x hidden 128, 8 experts, top-2: the router is 128 x 8.
    let data = small_moe(0.0, 2);
    let cfg = data.shape.moe().unwrap();
    let router = &data.layers[0].moe.as_ref().unwrap().router;
    let x = Val::exact(&data.x, 128);
    let (_, hn, _) = attention_half(&data, &data.layers[0], &x).unwrap();
    // The build redrew the router until its decisions were clear.
    assert!(decisive(&hn, router, &cfg).unwrap());
    // A top-k of 0 (once an index of k - 1 below 0).
    let e = decisive(&hn, router, &MoeConfig { top_k: 0, ..cfg })
        .unwrap_err()
        .to_string();
    assert!(e.contains("top-k = 0 must be in 1..=8"), "{e}");
    // A router short of a value (once read past its end).
    let e = decisive(&hn, &router[1..], &cfg).unwrap_err().to_string();
    assert!(
        e.contains("the router holds 1023 values; the config takes 128 rows of 8, 1024"),
        "{e}"
    );
    // Rows of 64 (hidden is 128).
    let halves = Val::exact(&data.x, 64);
    let e = decisive(&halves, router, &cfg).unwrap_err().to_string();
    assert!(
        e.contains(
            "x holds 768 values and 768 bounds in rows of 64; the config takes 6 rows of 128, 768"
        ),
        "{e}"
    );
}
