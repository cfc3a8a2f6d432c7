//! The MoE layer over token tiles (`moe_layer`): routing decided and tiles
//! counted on the device, checked against the f64 reference on the shim
//! and in semantic time, with task counts from the f64 routing.

use device_runtime::sched::RunOptions;
use host_tools::moe_layer::{self, pairs_per_expert, route, MoeConfig, MoeData};
use host_tools::semantic::{run_semantic, SemanticRun};
use host_tools::shim::Shim;
use host_tools::table::Arena;
use host_tools::workloads::{Params, Workload, WorkloadError};
use wsp_ffi::{
    CoreKind, WspKernelId_WSP_KERNEL_GATHER_ROWS as GATHER,
    WspKernelId_WSP_KERNEL_GEMM_TILE as GEMM, WspKernelId_WSP_KERNEL_MATMUL as MATMUL,
    WspKernelId_WSP_KERNEL_MOE_ALIGN as ALIGN, WspKernelId_WSP_KERNEL_MOE_ROUTE as ROUTE,
    WspKernelId_WSP_KERNEL_SILU_MUL as SILU,
};

const SMALL: MoeConfig = MoeConfig {
    tokens: 40,
    hidden: 64,
    ffn: 64,
    experts: 8,
    top_k: 2,
    threshold: 0.0,
    tile: 4,
    shared_ffn: 64,
};

/// The f64 routing of the layer's data (logits = x[:, ..E], exact).
fn routing(cfg: &MoeConfig, seed: u64, skew: bool) -> Vec<moe_layer::TokenRoute> {
    let data = MoeData::new(cfg, seed, skew).unwrap();
    let (h, e) = (cfg.hidden as usize, cfg.experts as usize);
    let logits: Vec<f32> = data.x.chunks(h).flat_map(|r| r[..e].to_vec()).collect();
    route(&logits, e, cfg.top_k as usize, cfg.threshold as f64).unwrap()
}

fn shim(w: &Workload, cube: usize, vector: usize) -> Arena {
    let mut arena = w.arena.clone();
    let shim = Shim {
        cube_cores: cube,
        vector_cores: vector,
        ..Shim::default()
    };
    let stats = shim.run(&w.table, &mut arena.bytes).unwrap();
    assert_eq!(stats.tasks as usize, w.tasks, "{}", w.summary);
    let check = w.verify(&arena);
    assert!(check.passed(), "{}: {check}", w.summary);
    arena
}

fn semantic(w: &Workload) -> (SemanticRun, Arena) {
    let mut arena = w.arena.clone();
    let kinds = [
        CoreKind::Cube,
        CoreKind::Cube,
        CoreKind::Vector,
        CoreKind::Vector,
    ];
    let run = run_semantic(&w.table, &mut arena.bytes, &kinds, &RunOptions::default()).unwrap();
    let check = w.verify(&arena);
    assert!(check.passed(), "{}: {check}", w.summary);
    (run, arena)
}

/// Launches per kernel the layer must make, counted from the f64 routing
/// by hand: (gemm_tile, moe_route, moe_align, gather_rows, silu_mul,
/// matmul). Each sum of block products is one `matmul` (its first) and a
/// `gemm_tile` per further block: the logits per token tile (hidden
/// blocks), g and u per expert tile and ffn block (hidden blocks), y per
/// expert tile and hidden block (ffn blocks), the shared expert's g and u
/// per token tile and block (hidden blocks); its down projection adds
/// onto the combine's output, all `gemm_tile`.
fn expected_launches(cfg: &MoeConfig, pairs: &[usize]) -> [usize; 6] {
    let blocks = |v: u32| v.div_ceil(64) as usize;
    let (nh, nf, ns) = (blocks(cfg.hidden), blocks(cfg.ffn), blocks(cfg.shared_ffn));
    let tiles: usize = pairs.iter().map(|&n| n.div_ceil(cfg.tile as usize)).sum();
    let token_tiles = (cfg.tokens as usize).div_ceil(64);
    let shared_tiles = if cfg.shared_ffn > 0 { token_tiles } else { 0 };
    // (sums, blocks each)
    let sums = [
        (token_tiles, nh),
        (tiles * nf * 2, nh),
        (tiles * nh, nf),
        (shared_tiles * ns * 2, nh),
    ];
    let matmul: usize = sums.iter().map(|&(n, _)| n).sum();
    let gemm: usize =
        sums.iter().map(|&(n, b)| n * (b - 1)).sum::<usize>() + shared_tiles * nh * ns;
    [
        gemm,
        token_tiles,
        1,
        tiles + (cfg.tokens as usize).div_ceil(16),
        // silu_mul per expert tile and block, the shared expert's, and the
        // softmax that makes the gather's ones is not counted here.
        tiles * nf + shared_tiles * ns,
        matmul,
    ]
}

fn launches(run: &SemanticRun) -> [usize; 6] {
    [GEMM, ROUTE, ALIGN, GATHER, SILU, MATMUL]
        .map(|k| run.launches.iter().filter(|l| l.kernel_id == k).count())
}

/// Runs `cfg` on the shim (1+1 and 2+2 cores) and in semantic time: every
/// run passes the f64 check, all three arenas are bit-identical, and the
/// launches per kernel are those the f64 routing implies.
fn runs_everywhere(cfg: &MoeConfig, seed: u64, skew: bool) -> (Workload, SemanticRun, Arena) {
    let w = moe_layer::workload("moe-layer", cfg, seed, skew).unwrap();
    let pairs = pairs_per_expert(&routing(cfg, seed, skew), cfg.experts as usize).unwrap();
    let one = shim(&w, 1, 1);
    let two = shim(&w, 2, 2);
    let (run, sem) = semantic(&w);
    assert!(one.bytes == two.bytes, "1+1 and 2+2 cores differ");
    assert!(one.bytes == sem.bytes, "the shim and semantic time differ");
    assert_eq!(launches(&run), expected_launches(cfg, &pairs));
    assert_eq!(run.stats.tasks as usize, w.tasks);
    (w, run, one)
}

#[test]
fn an_expert_with_every_token_and_experts_with_none() {
    // Skewed: expert 0 is every token's first choice, expert 7 nobody's.
    let pairs = pairs_per_expert(&routing(&SMALL, 3, true), 8).unwrap();
    assert_eq!(pairs[0], 40);
    assert_eq!(pairs[7], 0);
    assert_eq!(pairs.iter().sum::<usize>(), 80);
    let (_, run, _) = runs_everywhere(&SMALL, 3, true);
    // Expert 0 alone fills ceil(40 / 4) = 10 tiles.
    let tiles: usize = pairs.iter().map(|n| n.div_ceil(4)).sum();
    // Plus at least one tile of another expert.
    assert!(tiles > 10, "{pairs:?}");
    assert_eq!(launches(&run)[3], tiles + 3);
}

#[test]
fn variable_k_down_to_zero_experts() {
    // Top 4 of 8 kept while p >= 0.15: flat tokens (p about 1/8) keep none.
    let cfg = MoeConfig {
        tokens: 50,
        top_k: 4,
        threshold: 0.15,
        tile: 8,
        shared_ffn: 0,
        ..SMALL
    };
    let routes = routing(&cfg, 7, false);
    let kept: Vec<usize> = routes.iter().map(|r| r.experts.len()).collect();
    assert!(kept.contains(&0), "{kept:?}");
    assert!(kept.iter().any(|&k| k > 1), "{kept:?}");
    let (w, _, arena) = runs_everywhere(&cfg, 7, false);
    // Without a shared expert, a token routed nowhere gets a zero row.
    let out = &w.tensors[1];
    assert_eq!(out.name, "out");
    let out = arena.read_f32(out);
    for (t, r) in routes.iter().enumerate() {
        let row = &out[t * 64..(t + 1) * 64];
        assert_eq!(
            r.experts.is_empty(),
            row.iter().all(|&v| v == 0.0),
            "token {t}"
        );
    }
}

#[test]
fn uneven_tokens_blocks_and_a_tile_of_one() {
    // 70 tokens: a short last router tile (6) and combine tile (6); hidden
    // 128 = two blocks, ffn 32 one narrow block; tiles of 1 row (no padding).
    let cfg = MoeConfig {
        tokens: 70,
        hidden: 128,
        ffn: 32,
        top_k: 3,
        tile: 1,
        shared_ffn: 128,
        ..SMALL
    };
    runs_everywhere(&cfg, 11, false);
    // Tiles of 64 rows: every expert with a token pads up to 64.
    runs_everywhere(&MoeConfig { tile: 64, ..cfg }, 11, false);
}

/// The check fails on a wrong output element or a wrong routing decision.
#[test]
fn the_check_catches_a_wrong_element_and_a_wrong_route() {
    let w = moe_layer::workload("moe-layer", &SMALL, 3, false).unwrap();
    let arena = shim(&w, 1, 1);
    let find = |name: &str| w.tensors.iter().find(|t| t.name == name).unwrap().clone();
    let (out, ids) = (find("out"), find("moe.ids"));

    let mut bad = arena.clone();
    let mut values = bad.read_f32(&out);
    // Outputs are about 0.03 and their bounds about 4e-5.
    values[17] += 1e-3;
    bad.write_f32(&out, &values);
    assert!(!w.verify(&bad).passed());

    let mut bad = arena.clone();
    let mut values = bad.read_i32(&ids);
    values.swap(0, 1);
    bad.write_i32(&ids, &values);
    let v = w.verify(&bad);
    assert!(
        !v.passed() && v.output.contains("routing of token 0"),
        "{v}"
    );
}

#[test]
fn bad_sizes_are_errors_naming_the_cause() {
    let cases = [
        (MoeConfig { tokens: 0, ..SMALL }, "tokens = 0"),
        (
            MoeConfig {
                hidden: 96,
                ..SMALL
            },
            "hidden = 96",
        ),
        (MoeConfig { ffn: 100, ..SMALL }, "ffn = 100"),
        (
            MoeConfig {
                shared_ffn: 65,
                ..SMALL
            },
            "shared ffn = 65",
        ),
        (
            MoeConfig {
                experts: 65,
                ..SMALL
            },
            "experts = 65",
        ),
        (MoeConfig { top_k: 9, ..SMALL }, "top-k = 9"),
        (
            MoeConfig {
                threshold: 1.0,
                ..SMALL
            },
            "threshold = 1",
        ),
        (MoeConfig { tile: 0, ..SMALL }, "tile = 0"),
        (
            MoeConfig { hidden: 4, ..SMALL },
            "hidden (4) >= experts (8)",
        ),
        // The first multiple of 64 past MAX_FFN = 2^15 = 32768 is 32832.
        (
            MoeConfig {
                ffn: 32832,
                ..SMALL
            },
            "ffn = 32832 must be in 1..=64 or a multiple of 64 up to 32768",
        ),
        (
            MoeConfig {
                shared_ffn: 32832,
                ..SMALL
            },
            "shared ffn = 32832 must be in 1..=64 or a multiple of 64 up to 32768",
        ),
    ];
    for (cfg, want) in cases {
        match moe_layer::workload("moe-layer", &cfg, 1, false) {
            Err(WorkloadError::Params(msg)) => assert!(msg.contains(want), "{msg}"),
            Err(e) => panic!("{want}: {e}"),
            Ok(_) => panic!("{want}: accepted"),
        }
    } // MAX_FFN itself is taken, for the experts and the shared expert
      // (the check only: the weights would take 3 x 8 x 64 x 2^15 x 4 bytes).
    let largest = MoeConfig {
        ffn: 32768,
        shared_ffn: 32768,
        ..SMALL
    };
    largest.check().unwrap();
    assert_eq!(moe_layer::MAX_FFN, 32768);
}

/// The named workloads at their default sizes pass (release builds: the
/// default layer is 256 tokens of hidden 128).
#[test]
#[cfg_attr(debug_assertions, ignore = "default sizes: run with --release")]
fn named_workloads_pass_at_default_sizes() {
    for name in ["moe-layer", "moe-layer-var"] {
        let w = Workload::build(name, Params::of(name).unwrap()).unwrap();
        shim(&w, 2, 2);
    }
}

/// 64 experts, top-8 at a size a debug build runs in seconds: 256 tokens
/// of hidden 256 (four blocks), tiles of 16.
#[test]
fn sixty_four_experts_top8() {
    let cfg = MoeConfig {
        tokens: 256,
        hidden: 256,
        ffn: 64,
        experts: 64,
        top_k: 8,
        threshold: 0.0,
        tile: 16,
        shared_ffn: 64,
    };
    runs_everywhere(&cfg, 2, false);
}

/// The release size: 64 experts, top-8, 1,024 tokens, hidden 512,
/// on the shim and in semantic time, bit-identical.
#[test]
#[cfg_attr(debug_assertions, ignore = "release size: run with --release")]
fn release_size_64_experts_top8_1024_tokens_hidden_512() {
    let cfg = MoeConfig {
        tokens: 1024,
        hidden: 512,
        ffn: 128,
        experts: 64,
        top_k: 8,
        threshold: 0.0,
        tile: 16,
        shared_ffn: 128,
    };
    runs_everywhere(&cfg, 1, false);
}

/// The layer's own buffers need no zeroing: a second launch on the arena
/// the first left (its accumulators full of the first run's sums) passes
/// the f64 check again, bit for bit the first run's output.
#[test]
fn a_second_launch_on_the_same_arena_computes_the_same() {
    let w = moe_layer::workload("moe-layer", &SMALL, 3, false).unwrap();
    let first = shim(&w, 1, 1);
    let mut arena = first.clone();
    let stats = Shim::default().run(&w.table, &mut arena.bytes).unwrap();
    assert_eq!(stats.tasks as usize, w.tasks);
    let check = w.verify(&arena);
    assert!(check.passed(), "second launch: {check}");
    assert!(
        arena.bytes == first.bytes,
        "the second launch's arena differs"
    );
    // In semantic time too.
    let kinds = [CoreKind::Cube, CoreKind::Vector];
    run_semantic(&w.table, &mut arena.bytes, &kinds, &RunOptions::default()).unwrap();
    assert!(w.verify(&arena).passed(), "third launch");
    assert!(
        arena.bytes == first.bytes,
        "the third launch's arena differs"
    );
}

#[test]
fn the_router_and_counts_refuse_what_they_cannot_take() {
    use host_tools::moe_layer::TokenRoute;
    let e = |r: Result<Vec<TokenRoute>, WorkloadError>| r.unwrap_err().to_string();
    assert!(e(route(&[1.0], 0, 1, 0.0)).contains("0 experts"));
    assert!(e(route(&[1.0, 2.0], 2, 3, 0.0)).contains("top-k = 3 of 2 experts"));
    assert!(e(route(&[1.0, 2.0, 3.0], 2, 1, 0.0)).contains("3 logits are not whole rows of 2"));
    // Element 3 of rows of 2: token 1, expert 1.
    let why = e(route(&[1.0, 2.0, 3.0, f32::NAN], 2, 1, 0.0));
    assert!(why.contains("token 1's logit for expert 1 is NaN"), "{why}");
    // Equal logits: p = 1/2 each, the tie goes to the lower index.
    assert_eq!(
        route(&[0.0, 0.0], 2, 1, 0.0).unwrap(),
        [TokenRoute {
            experts: vec![0],
            weights: vec![1.0]
        }]
    );
    let routes = [
        TokenRoute {
            experts: vec![0],
            weights: vec![1.0],
        },
        TokenRoute {
            experts: vec![3, 0],
            weights: vec![0.5, 0.5],
        },
    ];
    assert_eq!(pairs_per_expert(&routes, 4).unwrap(), [2, 0, 0, 1]);
    let why = pairs_per_expert(&routes, 2).unwrap_err().to_string();
    assert!(why.contains("token 1 is routed to expert 3 of 2"), "{why}");
    // One token, top-1 of 4 experts, tiles of 1 row, one 64-block hidden and
    // ffn, no shared expert: 1 padded row, 1 expert tile. Tasks: 1 softmax
    // (ones), 1 router GEMM + 1 route, 1 alignment, 1 + 2 + 1 + 1 for the
    // tile (gather, gate and up, silu_mul, down), 1 combine: 10.
    let mut cfg = MoeConfig {
        tokens: 1,
        hidden: 64,
        ffn: 64,
        experts: 4,
        top_k: 1,
        threshold: 0.0,
        tile: 1,
        shared_ffn: 0,
    };
    assert_eq!(cfg.most_tasks().unwrap(), 10);
    // The token on expert 0 is that count; routed nowhere, no expert tile:
    // 10 - 5 = 5.
    assert_eq!(cfg.tasks(&[1, 0, 0, 0]).unwrap(), 10);
    assert_eq!(cfg.tasks(&[0, 0, 0, 0]).unwrap(), 5);
    // Counts for 3 of the 4 experts, and 2 pairs from 1 token x top-1,
    // are refused.
    let why = cfg.tasks(&[1, 0, 0]).unwrap_err().to_string();
    assert!(
        why.contains("pairs counted for 3 experts, not the 4"),
        "{why}"
    );
    let why = cfg.tasks(&[1, 1, 0, 0]).unwrap_err().to_string();
    assert!(
        why.contains("2 (token, slot) pairs exceed tokens x top-k = 1"),
        "{why}"
    );
    let why = cfg.tasks(&[usize::MAX; 4]).unwrap_err().to_string();
    assert!(why.contains("exceed tokens x top-k"), "{why}");
    // 1 x 1 pairs + 4 experts x (1 - 1) = 1 padded row; tiles of 3: 4 x 2
    // more, 9.
    assert_eq!(cfg.padded_rows().unwrap(), 1);
    cfg.tile = 3;
    assert_eq!(cfg.padded_rows().unwrap(), 9);
    cfg.tile = 0;
    let why = cfg.most_tasks().unwrap_err().to_string();
    assert!(why.contains("tile = 0"), "{why}");
    // A tile of 0 rows is refused by the count too, not a division by zero.
    let why = cfg.tasks(&[1, 0, 0, 0]).unwrap_err().to_string();
    assert!(why.contains("tile = 0"), "{why}");
    // A tile of 0 rows has no padding unit: refused, not an underflow.
    let why = cfg.padded_rows().unwrap_err().to_string();
    assert!(why.contains("tile = 0 must be in 1..=64"), "{why}");
    // (2^32 - 1)^2 pairs alone pass u32: refused, not an overflow.
    cfg.tile = 1;
    cfg.tokens = u32::MAX;
    cfg.top_k = u32::MAX;
    let why = cfg.padded_rows().unwrap_err().to_string();
    assert!(why.contains("exceed u32::MAX"), "{why}");
    assert!(cfg.check().is_err());
}

#[test]
fn the_reference_refuses_data_and_routes_not_of_its_config() {
    use host_tools::moe_layer::TokenRoute;
    // 2 tokens x hidden 8, 4 experts of ffn 8, top-2, a shared expert of
    // ffn 8: x is 2 x 8 = 16 values, gate (4 x 8) x 8 = 256.
    let cfg = MoeConfig {
        tokens: 2,
        hidden: 8,
        ffn: 8,
        experts: 4,
        top_k: 2,
        threshold: 0.0,
        tile: 1,
        shared_ffn: 8,
    };
    let data = MoeData::new(&cfg, 3, false).unwrap();
    let routes = routing(&cfg, 3, false);
    let (out, bound) = moe_layer::reference(&cfg, &data, &routes).unwrap();
    assert_eq!((out.len(), bound.len()), (16, 16));
    let e = |data: &MoeData, routes: &[TokenRoute]| {
        moe_layer::reference(&cfg, data, routes)
            .unwrap_err()
            .to_string()
    };
    // A route too many (it would read x past its 2 rows).
    let mut more = routes.clone();
    more.push(routes[0].clone());
    let why = e(&data, &more);
    assert!(
        why.contains("routes for 3 tokens; the config has 2"),
        "{why}"
    );
    // Buffers of other sizes than the config's.
    let mut short = data.clone();
    short.x.pop();
    let why = e(&short, &routes);
    assert!(
        why.contains("x holds 15 values; its shape takes 2 rows of 8, 16"),
        "{why}"
    );
    let mut short = data.clone();
    short.gate.truncate(200);
    let why = e(&short, &routes);
    assert!(
        why.contains("gate holds 200 values; its shape takes 32 rows of 8, 256"),
        "{why}"
    );
    let mut short = data.clone();
    short.shared[2].clear();
    let why = e(&short, &routes);
    assert!(
        why.contains("shared down holds 0 values; its shape takes 8 rows of 8, 64"),
        "{why}"
    );
    // Routes the config cannot have made.
    let mut bad = routes.clone();
    bad[0] = TokenRoute {
        experts: vec![4],
        weights: vec![1.0],
    };
    let why = e(&data, &bad);
    assert!(why.contains("token 0 is routed to expert 4 of 4"), "{why}");
    bad[0] = TokenRoute {
        experts: vec![0, 1],
        weights: vec![1.0],
    };
    let why = e(&data, &bad);
    assert!(
        why.contains("token 0's route has 2 experts and 1 weights"),
        "{why}"
    );
    bad[0] = TokenRoute {
        experts: vec![0, 1, 2],
        weights: vec![0.5, 0.25, 0.25],
    };
    let why = e(&data, &bad);
    assert!(
        why.contains("token 0's route keeps 3 experts, more than top-k = 2"),
        "{why}"
    );
    // A config the layer cannot take is refused by its check.
    let why = moe_layer::reference(&MoeConfig { tile: 0, ..cfg }, &data, &routes)
        .unwrap_err()
        .to_string();
    assert!(why.contains("tile = 0 must be in 1..=64"), "{why}");
}
