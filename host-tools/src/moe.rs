//! The MoE routing workloads (`moe`, `moe-var`): a router whose output
//! decides, on the device, which expert tasks exist.
//!
//! The program, in the workload language:
//!
//! ```text
//! logits = x @ wg                              (gemm_tile, one task)
//! indptr, tokens, weights = route_topk(logits) (top-k per token, CSR by expert)
//! parallel e in 0..E:
//!     select (j, t) in row e of (indptr, tokens):   -- read after the router ran
//!         out[t] += weights[j] * (x[t] @ w_e)       (expert_rows, one task)
//! ```
//!
//! Only the experts a token was routed to run for it: the number of tasks
//! and which ones exist depend on the data. `moe` routes every token to
//! its top 2 of 8 experts; `moe-var` to between 1 and 4 (its top 4, minus
//! those whose router probability is below 0.15).

use wsp_ffi::{
    WspKernelId_WSP_KERNEL_EXPERT_ROWS as EXPERT, WspKernelId_WSP_KERNEL_GEMM_TILE as GEMM,
    WspKernelId_WSP_KERNEL_ROUTE_TOPK as ROUTE,
};

use device_runtime::sched::Schedule;

use crate::attention::sparse::failed;
use crate::program::{Axis, Expr, Workload as Program};
use crate::reference::{self, Routing};
use crate::rng::SplitMix64;
use crate::table::Arena;
use crate::workloads::{gemm_bound, Params, Verification, Workload, WorkloadError, GEMM_TOLERANCE};

/// Experts of the layer.
pub const EXPERTS: u32 = 8;
/// How far apart (in router probability) the data keeps every routing
/// decision from a tie or from the threshold, so that the f32 router and
/// the f64 reference must agree.
const MARGIN: f64 = 1e-3;

/// Whether every routing decision on these logits is clear by [`MARGIN`].
fn decisive(logits: &[f64], experts: usize, k: usize, threshold: f64) -> bool {
    reference::softmax_unchecked(logits, experts)
        .chunks(experts)
        .all(|p| {
            let mut sorted = p.to_vec();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let gap = k == experts || sorted[k - 1] - sorted[k] > MARGIN;
            let away =
                threshold == 0.0 || sorted[..k].iter().all(|v| (v - threshold).abs() > MARGIN);
            gap && away
        })
}

/// The MoE layer with `k` experts per token at most, dropping those under
/// `threshold` (0: exactly `k`). Sizes: tokens `m` (<= 64), hidden `k` and
/// ffn `n` (<= 64 each); default 32 x 64 x 64.
pub(crate) fn moe(
    name: &'static str,
    p: Params,
    top: u32,
    threshold: f32,
) -> Result<Workload, WorkloadError> {
    moe_with(name, p, top, threshold, None)
}

/// [`moe`](crate::workloads::Workload::build)'s layer (`moe`: top 2,
/// threshold 0; `moe-var`: top 4, threshold 0.15; `top` in 1 ..=
/// [`EXPERTS`], `threshold` in [0, 1)) whose expert loop, when
/// `experts` is given, is a taskset of its own with that schedule (e.g.
/// affinity by `loop:0`, the expert); the router's calls keep the run's.
pub fn moe_with(
    name: &'static str,
    p: Params,
    top: u32,
    threshold: f32,
    experts: Option<Schedule>,
) -> Result<Workload, WorkloadError> {
    let (tokens, hidden, ffn) = (p.m, p.k, p.n);
    for (what, v) in [
        ("m (tokens)", tokens),
        ("k (hidden)", hidden),
        ("n (ffn)", ffn),
    ] {
        if v == 0 || v > 64 {
            return Err(WorkloadError::Params(format!(
                "{what} = {v} must be in 1..=64"
            )));
        }
    }
    let e = EXPERTS;
    if !(1..=e).contains(&top) {
        return Err(WorkloadError::Params(format!(
            "top = {top} experts per token must be in 1..={e} (the experts)"
        )));
    }
    if !(0.0..1.0).contains(&threshold) {
        return Err(WorkloadError::Params(format!(
            "threshold = {threshold} must be in [0, 1)"
        )));
    }
    // Checked above: tokens, hidden and ffn <= 64 and top <= 8 experts,
    // so the products below are at most 8 x 64 x 64.
    let slots = tokens * top;
    // Data whose routing is clear: reseed until it is.
    let (mut x, mut wg) = (Vec::new(), Vec::new());
    let (mut logits64, mut logits_abs) = (Vec::new(), Vec::new());
    let found = (0..1000).any(|attempt| {
        let mut rng = SplitMix64::new(p.seed.wrapping_add(attempt * 0x9E37_79B9));
        x = rng.fill((tokens * hidden) as usize);
        // Logits of spread about 1: router probabilities neither uniform nor one-hot.
        wg = rng
            .fill((hidden * e) as usize)
            .iter()
            .map(|v| v * 0.25)
            .collect();
        (logits64, logits_abs) =
            reference::gemm_unchecked(&x, &wg, tokens as usize, e as usize, hidden as usize);
        decisive(&logits64, e as usize, top as usize, threshold as f64)
    });
    if !found {
        return Err(WorkloadError::Params(
            "no seed near this one gives routing clear of ties".into(),
        ));
    }
    let mut rng = SplitMix64::new(p.seed ^ 0x5EED);
    let wv = rng.fill((e * hidden * ffn) as usize);

    let mut w = Program::new();
    let tx = w.tensor("x", &[tokens, hidden]).map_err(lower)?;
    let twg = w.tensor("wg", &[hidden, e]).map_err(lower)?;
    let tlogits = w.tensor("logits", &[tokens, e]).map_err(lower)?;
    let tindptr = w.tensor_i32("indptr", &[1, e + 1]).map_err(lower)?;
    let ttokens = w.tensor_i32("tokens", &[1, slots]).map_err(lower)?;
    let tweights = w.tensor("weights", &[1, slots]).map_err(lower)?;
    let tw = w.tensor("w", &[e * hidden, ffn]).map_err(lower)?;
    let tout = w.tensor("out", &[tokens, ffn]).map_err(lower)?;
    w.call(
        GEMM,
        &[
            tx.tile(0, 0, tokens, hidden),
            twg.tile(0, 0, hidden, e),
            tlogits.tile(0, 0, tokens, e),
        ],
        &[],
    );
    w.call(
        ROUTE,
        &[
            tlogits.tile(0, 0, tokens, e),
            tindptr.tile(0, 0, 1, e + 1),
            ttokens.tile(0, 0, 1, slots),
            tweights.tile(0, 0, 1, slots),
        ],
        &[Expr::from(top), Expr::Const(threshold.to_bits() as i64)],
    );
    let expert_loop = |w: &mut Program| {
        w.parallel(Axis::Dense(e), |w, expert| {
            w.select(tindptr, ttokens, expert.clone(), tokens, |w, j, token| {
                w.call(
                    EXPERT,
                    &[
                        tx.tile(token.clone(), 0, 1, hidden),
                        tw.tile(expert.clone() * hidden, 0, hidden, ffn),
                        tweights.tile(0, j, 1, 1),
                        tout.tile(token, 0, 1, ffn),
                    ],
                    &[],
                );
            });
        })
    };
    match experts {
        Some(s) => w.dispatch(s.policy, s.key, expert_loop),
        None => expert_loop(&mut w),
    }
    let table = w.finish().map_err(lower)?;

    let mut arena = Arena::zeroed(w.arena_size());
    arena.write_f32(w.layout(tx), &x);
    arena.write_f32(w.layout(twg), &wg);
    arena.write_f32(w.layout(tw), &wv);
    // The task count the f64 routing implies (the data keeps f32 and f64
    // routing equal): the GEMM, the router, one task per (token, expert).
    let logits32: Vec<f32> = logits64.iter().map(|&v| v as f32).collect();
    let planned = reference::route_topk(
        &logits32,
        tokens as usize,
        e as usize,
        top as usize,
        threshold as f64,
    )?;
    let tasks = 2 + planned.tokens.len();

    let layouts = [tlogits, tindptr, ttokens, tout].map(|t| w.layout(t).clone());
    let logits_bound = gemm_bound(logits_abs, hidden);
    let (t, h, f, k) = (tokens as usize, hidden as usize, ffn as usize, top as usize);
    let check = move |arena: &Arena| {
        let [l_logits, l_indptr, l_tokens, l_out] = &layouts;
        // 1. The router's input, against the f64 GEMM.
        let logits = arena.read_f32(l_logits);
        let v = Verification::compare("logits", &logits, &logits64, &logits_bound, GEMM_TOLERANCE);
        if !v.passed() {
            return v;
        }
        // 2. The expert choice: the f64 router on the device's logits.
        // k and the threshold were checked above, and the arena's size is
        // checked before this runs; a refusal still fails the check.
        let routing = match reference::route_topk(&logits, t, EXPERTS as usize, k, threshold as f64)
        {
            Ok(r) => r,
            Err(e) => {
                return failed(
                    format!("the f64 router: {e}"),
                    "the expert choice must equal the f64 router's",
                )
            }
        };
        let indptr: Vec<usize> = arena
            .read_i32(l_indptr)
            .iter()
            .map(|&v| v as usize)
            .collect();
        let chosen: Vec<usize> = arena.read_i32(l_tokens)[..routing.tokens.len()]
            .iter()
            .map(|&v| v as usize)
            .collect();
        if indptr != routing.indptr || chosen != routing.tokens {
            return routing_mismatch(&routing, &indptr, &chosen);
        }
        // 3. The layer's output.
        // The sizes are those x and w were made with, and the routing is
        // route_topk's; a refusal still fails the check.
        let (want, abs) = match reference::moe(&x, &wv, &routing, t, h, f) {
            Ok(r) => r,
            Err(e) => {
                return failed(
                    format!("the f64 layer: {e}"),
                    "the layer's output must match the f64 reference's",
                )
            }
        };
        Verification::compare(
            "out",
            &arena.read_f32(l_out),
            &want,
            // gamma_(H+k+18), as the GEMM bound with H+k+17 terms.
            gemm_bound(abs, (h + k + 17) as u32),
            "|out - ref| <= gamma_(H+k+18) * sum |gate * x * w|: the expert GEMM, \
             the accumulation over k experts, and the f32 router's gate (16 u)",
        )
    };
    Ok(Workload {
        name,
        summary: format!(
            "MoE layer: {tokens} tokens x {hidden} hidden -> {ffn}, {e} experts, \
             top-{top}{} routing decided on the device",
            if threshold > 0.0 {
                format!(" (experts under p = {threshold} dropped)")
            } else {
                String::new()
            }
        ),
        table,
        arena,
        tensors: w.layouts().to_vec(),
        tasks,
        check: Box::new(check),
        csp: Default::default(),
    })
}

fn lower(e: crate::program::LowerError) -> WorkloadError {
    WorkloadError::Params(e.to_string())
}

fn routing_mismatch(want: &Routing, indptr: &[usize], tokens: &[usize]) -> Verification {
    Verification {
        output: format!(
            "routing: device indptr {indptr:?} tokens {tokens:?}, f64 reference indptr {:?} tokens {:?}",
            want.indptr, want.tokens
        ),
        elements: want.tokens.len(),
        max_abs_err: f64::INFINITY,
        max_rel_err: f64::INFINITY,
        worst_error_over_bound: f64::INFINITY,
        tolerance: "the expert choice must equal the f64 router's",
    }
}
