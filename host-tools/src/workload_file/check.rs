//! Checking a run against the f64 reference.

use wsp_ffi::DTYPE_I32;

use super::kernels::TINY;
use super::FileWorkload;
use crate::table::Arena;
use crate::workloads::Verification;

const F32_TOLERANCE: &str = "|run - f64| <= propagated f32 rounding bound";
const I32_TOLERANCE: &str = "i32 outputs equal the reference exactly";
const UNCHANGED: &str = "tensors no task writes are unchanged, bit for bit";

impl FileWorkload {
    /// Checks a run's arena against the f64 reference: one line per tensor
    /// the tasks write, and one for the others (unchanged).
    pub fn check(&self, arena: &Arena) -> Vec<Verification> {
        if arena.bytes.len() != self.arena.bytes.len() {
            return vec![Verification::arena_size(
                arena.bytes.len(),
                self.arena.bytes.len(),
            )];
        }
        let mut out: Vec<Verification> = self.nothing_ran().into_iter().collect();
        let mut unchanged = Vec::new();
        let mut changed = Vec::new();
        for (t, layout) in self.tensors.iter().enumerate() {
            // Scratch tensors have no arena bytes to check: what they held
            // reaches the outputs, which are checked.
            if layout.is_scratch() {
                continue;
            }
            if !self.written[t] {
                let range = layout.arena_offset as usize
                    ..layout.arena_offset as usize + layout.elements() * 4;
                if arena.bytes[range.clone()] == self.arena.bytes[range] {
                    unchanged.push(layout.name.as_str());
                } else {
                    changed.push(layout.name.as_str());
                }
                continue;
            }
            let (want, bound) = (&self.expected[t], &self.bounds[t]);
            if layout.dtype == DTYPE_I32 {
                let got = arena.read_i32(layout);
                let diff: Vec<usize> = (0..got.len())
                    .filter(|&i| got[i] as f64 != want[i])
                    .collect();
                let max_abs_err = diff
                    .iter()
                    .map(|&i| (got[i] as f64 - want[i]).abs())
                    .fold(0.0, f64::max);
                out.push(Verification {
                    output: match diff.first() {
                        None => format!("{} (i32)", layout.name),
                        Some(&i) => format!(
                            "{} (i32): {} of {} elements differ, the first at {i}: run {}, reference {}",
                            layout.name,
                            diff.len(),
                            got.len(),
                            got[i],
                            want[i]
                        ),
                    },
                    elements: got.len(),
                    max_abs_err,
                    max_rel_err: if diff.is_empty() { 0.0 } else { f64::INFINITY },
                    worst_error_over_bound: if diff.is_empty() { 0.0 } else { f64::INFINITY },
                    tolerance: I32_TOLERANCE,
                });
                continue;
            }
            let got = arena.read_f32(layout);
            let mut v = Verification {
                output: layout.name.clone(),
                elements: got.len(),
                max_abs_err: 0.0,
                max_rel_err: 0.0,
                worst_error_over_bound: 0.0,
                tolerance: F32_TOLERANCE,
            };
            for i in 0..got.len() {
                let (g, w) = (got[i] as f64, want[i]);
                let err = if g == w || (g.is_nan() && w.is_nan()) {
                    0.0
                } else {
                    (g - w).abs()
                };
                let ratio = if err == 0.0 {
                    0.0
                } else {
                    err / (bound[i] + TINY)
                };
                if !err.is_nan() {
                    v.max_abs_err = v.max_abs_err.max(err);
                }
                if w != 0.0 && w.is_finite() {
                    v.max_rel_err = v.max_rel_err.max(err / w.abs());
                }
                // NaN compares false: make it fail loudly.
                v.worst_error_over_bound = if ratio.is_nan() {
                    f64::INFINITY
                } else {
                    v.worst_error_over_bound.max(ratio)
                };
            }
            out.push(v);
        }
        if !unchanged.is_empty() || !changed.is_empty() {
            out.push(Verification {
                output: if changed.is_empty() {
                    format!("unwritten tensors {}", unchanged.join(", "))
                } else {
                    format!(
                        "unwritten tensors: {} changed (no task writes them)",
                        changed.join(", ")
                    )
                },
                elements: unchanged.len() + changed.len(),
                max_abs_err: 0.0,
                max_rel_err: 0.0,
                worst_error_over_bound: if changed.is_empty() {
                    0.0
                } else {
                    f64::INFINITY
                },
                tolerance: UNCHANGED,
            });
        }
        out
    }

    /// A failed check when the reference expansion has no task: every
    /// call skipped at run time (a `when` of 0, a loop of 0 iterations,
    /// for these symbols). A run of no task would pass whatever the
    /// runtime did, so it does not pass.
    fn nothing_ran(&self) -> Option<Verification> {
        if !self.tasks.is_empty() {
            return None;
        }
        let symbols: Vec<String> = self
            .symbol_names
            .iter()
            .zip(&self.symbols)
            .map(|(n, v)| format!("{n} = {v}"))
            .collect();
        let with = if symbols.is_empty() {
            String::new()
        } else {
            format!(" with {}", symbols.join(", "))
        };
        Some(Verification {
            output: format!(
                "nothing ran: the program{with} skips every call (a `when` of 0, a loop of 0 \
                 iterations), so its reference has no task, and a run of no task would pass \
                 whatever the runtime did"
            ),
            elements: 0,
            max_abs_err: 0.0,
            max_rel_err: 0.0,
            worst_error_over_bound: f64::INFINITY,
            tolerance: "a run must run at least one task",
        })
    }

    /// Whether a run of `ran` tasks ran the reference expansion's number.
    pub fn check_task_count(&self, ran: usize) -> Verification {
        let ok = ran == self.tasks.len();
        Verification {
            output: format!(
                "tasks: the run ran {ran}, the reference expansion has {}",
                self.tasks.len()
            ),
            elements: ran,
            max_abs_err: 0.0,
            max_rel_err: 0.0,
            worst_error_over_bound: if ok { 0.0 } else { f64::INFINITY },
            tolerance: "the same number of tasks",
        }
    }
}
