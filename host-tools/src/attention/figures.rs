//! Makespan against the lower bound in semantic time, per split strategy.

use device_runtime::sched::RunOptions;
use wsp_ffi::CoreKind;

use super::workload::{MERGE, PARTIAL};
use crate::semantic::{run_semantic, Launch};
use crate::shim::ShimError;
use crate::workloads::{Verification, Workload};

/// One semantic run of a decode workload, with the parts of its bound.
#[derive(Clone, Debug)]
pub struct Figure {
    /// Cycles from the first issue to the last completion.
    pub makespan: u64,
    /// Cycles of all `attn_decode_partial` launches (cube cores).
    pub cube_work: u64,
    /// Cycles of all `attn_merge` launches (vector cores).
    pub vector_work: u64,
    /// The longest chain: a partial, plus the merge that reads it if any.
    pub chain: u64,
    /// `max(cube_work / cube cores, vector_work / vector cores, chain)`,
    /// divisions rounded up: this plan's lower bound.
    pub bound: u64,
    /// The check of the run's output.
    pub check: Verification,
}

fn cycles(l: &Launch) -> u64 {
    l.end - l.start
}

/// Byte range of a launch's tensor argument `i`.
fn span(l: &Launch, i: usize) -> (u64, u64) {
    let v = &l.args.tensors[i];
    let len = (v.rows.saturating_sub(1) as u64 * v.row_stride as u64 + v.cols as u64) * 4;
    (v.addr, v.addr + len)
}

/// Runs `w` in semantic time on `kinds` and measures it.
pub fn measure(w: &Workload, kinds: &[CoreKind]) -> Result<Figure, ShimError> {
    let mut arena = w.arena.clone();
    let run = run_semantic(&w.table, &mut arena.bytes, kinds, &RunOptions::default())?;
    let check = w.verify(&arena);
    let of = |id| run.launches.iter().filter(move |l| l.kernel_id == id);
    let cube_work: u64 = of(PARTIAL).map(cycles).sum();
    let vector_work: u64 = of(MERGE).map(cycles).sum();
    // A merge's chain: its longest partial (whose output lies in its input) plus itself.
    let merges: Vec<((u64, u64), u64)> = of(MERGE).map(|m| (span(m, 0), cycles(m))).collect();
    let chain = of(PARTIAL)
        .map(|p| {
            let (at, _) = span(p, 3);
            let merge = merges
                .iter()
                .find(|((lo, hi), _)| (*lo..*hi).contains(&at))
                .map_or(0, |&(_, c)| c);
            cycles(p) + merge
        })
        .max()
        .unwrap_or(0);
    let count = |k| kinds.iter().filter(|&&c| c == k).count().max(1) as u64;
    let bound = cube_work
        .div_ceil(count(CoreKind::Cube))
        .max(vector_work.div_ceil(count(CoreKind::Vector)))
        .max(chain);
    Ok(Figure {
        makespan: run.makespan,
        cube_work,
        vector_work,
        chain,
        bound,
        check,
    })
}
