//! Small workload programs, one per axis and loop kind, and the checks of
//! a run's output against the host's reference expansion
//! ([`Workload::expand`]). The shim tests (`host-tools/tests/program.rs`)
//! and the QEMU tests (`tests/tests/qemu.rs`) run the same programs and
//! apply the same checks.
//!
//! Every program works on 64x64 f32 tensors in `T` x `T` tiles: `y[tile] =
//! x[tile] + x[tile]` (the ADD kernel) for the tiles its loops reach, and
//! for the ragged program a softmax over the long row blocks into `z`.

use wsp_ffi::{WspKernelId_WSP_KERNEL_ADD as ADD, WspKernelId_WSP_KERNEL_SOFTMAX as SOFTMAX};

use crate::program::{Axis, Expr, Workload};
use crate::table::{Arena, TensorId};

/// Tile edge.
pub const T: u32 = 8;

/// `y[tile] = x[tile] + x[tile]` on the `T` x `T` tile at (`row`, `col`)
/// in tile units.
pub fn add_tile(w: &mut Workload, x: TensorId, y: TensorId, row: Expr, col: Expr) {
    let r = row * T;
    let c = col * T;
    w.call(
        ADD,
        &[
            x.tile(r.clone(), c.clone(), T, T),
            x.tile(r.clone(), c.clone(), T, T),
            y.tile(r, c, T, T),
        ],
        &[],
    );
}

/// A program's workload (not yet lowered) and its tensors.
pub struct Example {
    /// The program, with its tensors declared.
    pub w: Workload,
    /// The input, 64x64 f32.
    pub x: TensorId,
    /// The output: `x + x` on the tiles the program reaches, 0 elsewhere.
    pub y: TensorId,
    /// The ragged program's softmax output.
    pub z: Option<TensorId>,
    /// The ragged program's lengths (an input, one per row block).
    pub lengths: Option<TensorId>,
}

/// A `DenseDyn` axis (rows: symbol 0, at most 8) around a `Dense(3)` one
/// (columns 1..=3): `3 * symbol 0` tasks.
pub fn dense_dyn() -> Example {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let y = w.tensor("y", &[64, 64]).unwrap();
    w.parallel(Axis::DenseDyn { symbol: 0, max: 8 }, |w, i| {
        w.parallel(Axis::Dense(3), |w, j| add_tile(w, x, y, i, j + 1))
    });
    Example {
        w,
        x,
        y,
        z: None,
        lengths: None,
    }
}

/// Host-provided lengths (`lengths[0][b]` for row block `b` of 8): a
/// `Ragged` axis over the columns of the short row blocks (length at most
/// 4), and `when`/otherwise choosing a softmax over the whole row block for
/// the long ones.
pub fn ragged() -> Example {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let y = w.tensor("y", &[64, 64]).unwrap();
    let z = w.tensor("z", &[64, 64]).unwrap();
    let lengths = w.tensor_i32("lengths", &[1, 8]).unwrap();
    w.input(lengths);
    w.parallel(Axis::Dense(8), |w, b| {
        // Loaded once per row block, held in a register.
        let len = w.let_(Expr::load(lengths, vec![Expr::Const(0), b.clone()]));
        w.when(
            len.clone().le(4),
            |w| {
                let b = b.clone();
                w.parallel(
                    Axis::Ragged {
                        lengths,
                        at: vec![Expr::Const(0), b.clone()],
                        max: 8,
                    },
                    |w, c| add_tile(w, x, y, b, c),
                );
            },
            |w| {
                // Long rows: one softmax over the whole row block.
                let r = b.clone() * T;
                w.call(
                    SOFTMAX,
                    &[x.tile(r.clone(), 0, T, 64), z.tile(r, 0, T, 64)],
                    &[],
                );
            },
        );
    });
    Example {
        w,
        x,
        y,
        z: Some(z),
        lengths: Some(lengths),
    }
}

/// A loop over the 8 row blocks of column 0, sequential (iteration `i + 1`
/// expanded after iteration `i` completed) or parallel.
pub fn column(sequential: bool) -> Example {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let y = w.tensor("y", &[64, 64]).unwrap();
    let body = |w: &mut Workload, i: Expr| add_tile(w, x, y, i, Expr::Const(0));
    if sequential {
        w.sequential(Axis::Dense(8), body);
    } else {
        w.parallel(Axis::Dense(8), body);
    }
    Example {
        w,
        x,
        y,
        z: None,
        lengths: None,
    }
}

impl Example {
    /// An arena of the workload's size with distinct values in `x` (and
    /// `lengths`, if given, in the lengths tensor).
    pub fn arena(&self, lengths: Option<&[i32]>) -> Arena {
        let mut arena = Arena::zeroed(self.w.arena_size());
        let n = self.w.layout(self.x).elements();
        let values: Vec<f32> = (0..n).map(|i| (i % 97) as f32 + 0.5).collect();
        arena.write_f32(self.w.layout(self.x), &values);
        if let (Some(t), Some(lens)) = (self.lengths, lengths) {
            arena.write_i32(self.w.layout(t), lens);
        }
        arena
    }

    /// The tiles of `y` a run wrote (nonzero), as (tile row, tile col).
    pub fn written_tiles(&self, arena: &Arena) -> Vec<(u32, u32)> {
        let layout = self.w.layout(self.y);
        let values = arena.read_f32(layout);
        let cols = layout.shape[1];
        let mut tiles = Vec::new();
        for tr in 0..layout.shape[0] / T {
            for tc in 0..cols / T {
                if values[((tr * T) * cols + tc * T) as usize] != 0.0 {
                    tiles.push((tr, tc));
                }
            }
        }
        tiles
    }

    /// The tiles of `y` the host's reference expansion writes.
    pub fn expected_tiles(&self, arena: &Arena, symbols: &[i64]) -> Vec<(u32, u32)> {
        let y = self.y.0;
        let mut tiles: Vec<(u32, u32)> = self
            .w
            .expand(arena, symbols)
            .unwrap()
            .iter()
            .flat_map(|t| {
                t.args
                    .iter()
                    .filter(|a| a.0 == y)
                    .map(|a| (a.1[0] / T, a.1[1] / T))
            })
            .collect();
        tiles.sort();
        tiles.dedup();
        tiles
    }

    /// Checks a run's output arena against the host's reference expansion
    /// with `symbols`: the run wrote exactly the tiles of `y` the reference
    /// writes, each `x + x` exactly, and (ragged program) softmaxed exactly
    /// the long row blocks of `z`. Returns the reference's task count.
    pub fn check(&self, arena: &Arena, symbols: &[i64]) -> Result<usize, String> {
        let expected = self.w.expand(arena, symbols)?;
        let tiles = self.written_tiles(arena);
        let want = self.expected_tiles(arena, symbols);
        if tiles != want {
            return Err(format!(
                "tiles of y written {tiles:?}, the reference writes {want:?}"
            ));
        }
        let (xs, ys) = (
            arena.read_f32(self.w.layout(self.x)),
            arena.read_f32(self.w.layout(self.y)),
        );
        for &(tr, tc) in &tiles {
            for r in tr * T..(tr + 1) * T {
                for c in tc * T..(tc + 1) * T {
                    let i = (r * 64 + c) as usize;
                    if ys[i] != xs[i] + xs[i] {
                        return Err(format!("y[{r}][{c}] = {}, want {}", ys[i], xs[i] + xs[i]));
                    }
                }
            }
        }
        if let (Some(z), Some(lengths)) = (self.z, self.lengths) {
            let lens = arena.read_i32(self.w.layout(lengths));
            let zs = arena.read_f32(self.w.layout(z));
            for (b, &l) in lens.iter().enumerate() {
                for r in 0..T as usize {
                    let row = &zs[(b * T as usize + r) * 64..][..64];
                    let sum: f32 = row.iter().sum();
                    let softmaxed = (sum - 1.0).abs() < 1e-4;
                    if softmaxed != (l > 4) {
                        return Err(format!(
                            "row block {b} (length {l}), row {r}: sum {sum}, softmaxed {softmaxed}"
                        ));
                    }
                }
            }
        }
        Ok(expected.len())
    }
}
