//! The lower bound of a semantic-time run's makespan, from what ran: no
//! schedule on these cores can end before every core kind's work is done
//! (`work / cores`) nor before the longest chain of dependent tasks
//! (their cycles summed).
//!
//! The dependencies are found from the launches alone, independently of
//! the runtime's TensorMap: two launches conflict when a tensor argument
//! of one and one of the other share a byte and at least one of the two
//! writes it (the kernel registry says which arguments a kernel writes);
//! the later one in issue order depends on the earlier. Issue order keeps
//! program order between conflicting tasks (the runtime issues a task only
//! after the tasks it depends on completed), so this is the program's
//! dependency graph.

use wsp_ffi::{lookup, CoreKind, WspTensorView};

use crate::semantic::Launch;

/// The parts of a run's lower bound, in cycles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    /// Cycles of the launches on cube cores.
    pub cube_work: u64,
    /// Cycles of the launches on vector cores.
    pub vector_work: u64,
    /// The longest chain of dependent launches.
    pub critical_path: u64,
    /// `max(cube_work / cube cores, vector_work / vector cores,
    /// critical_path)`, divisions rounded up.
    pub bound: u64,
}

/// A tensor argument's bytes: `rows` intervals of `len` bytes, `stride`
/// bytes apart from `addr`.
#[derive(Clone, Copy, Debug)]
struct Span {
    addr: i128,
    rows: i128,
    len: i128,
    stride: i128,
    writes: bool,
}

impl Span {
    fn of(v: &WspTensorView, writes: bool) -> Span {
        Span {
            addr: v.addr as i128,
            rows: v.rows as i128,
            len: 4 * v.cols as i128,
            stride: 4 * v.row_stride as i128,
            writes,
        }
    }

    /// One past the last byte.
    fn end(&self) -> i128 {
        self.addr + (self.rows - 1) * self.stride + self.len
    }

    /// Whether some row of `self` meets `[x, x + len)`.
    fn meets(&self, x: i128, len: i128) -> bool {
        if self.rows == 1 || self.stride == 0 {
            return self.addr < x + len && x < self.addr + self.len;
        }
        // Rows r with addr + r s < x + len and addr + r s + self.len > x.
        let lo = (x - self.len - self.addr).div_euclid(self.stride) + 1;
        let hi = (x + len - self.addr - 1).div_euclid(self.stride);
        lo.max(0) <= hi.min(self.rows - 1)
    }

    /// Whether the two spans share a byte.
    fn overlaps(&self, other: &Span) -> bool {
        if self.end() <= other.addr || other.end() <= self.addr {
            return false;
        }
        let (few, many) = if self.rows <= other.rows {
            (self, other)
        } else {
            (other, self)
        };
        (0..few.rows).any(|r| many.meets(few.addr + r * few.stride, few.len))
    }
}

fn spans(l: &Launch) -> Vec<Span> {
    let info = lookup(l.kernel_id);
    (0..l.args.num_tensors as usize)
        .map(|i| {
            let writes = info
                .and_then(|k| k.tensor_args.get(i))
                .is_none_or(|a| a.access.writes());
            Span::of(&l.args.tensors[i], writes)
        })
        .collect()
}

fn conflict(a: &[Span], b: &[Span]) -> bool {
    a.iter()
        .any(|x| b.iter().any(|y| (x.writes || y.writes) && x.overlaps(y)))
}

/// The lower bound of `launches` (a semantic run's, in issue order) on
/// cores of `kinds`.
pub fn lower_bound(launches: &[Launch], kinds: &[CoreKind]) -> Bound {
    let cycles = |l: &Launch| l.end - l.start;
    let work = |kind| -> u64 {
        launches
            .iter()
            .filter(|l| kinds.get(l.core) == Some(&kind))
            .map(cycles)
            .sum()
    };
    let (cube_work, vector_work) = (work(CoreKind::Cube), work(CoreKind::Vector));
    let all: Vec<Vec<Span>> = launches.iter().map(spans).collect();
    let mut finish = vec![0u64; launches.len()];
    for b in 0..launches.len() {
        let before = (0..b)
            .filter(|&a| conflict(&all[a], &all[b]))
            .map(|a| finish[a])
            .max()
            .unwrap_or(0);
        finish[b] = before + cycles(&launches[b]);
    }
    let critical_path = finish.iter().copied().max().unwrap_or(0);
    let count = |k| kinds.iter().filter(|&&c| c == k).count().max(1) as u64;
    Bound {
        cube_work,
        vector_work,
        critical_path,
        bound: cube_work
            .div_ceil(count(CoreKind::Cube))
            .max(vector_work.div_ceil(count(CoreKind::Vector)))
            .max(critical_path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(addr: i128, rows: i128, cols: i128, stride: i128) -> Span {
        Span {
            addr,
            rows,
            len: 4 * cols,
            stride: 4 * stride,
            writes: true,
        }
    }

    #[test]
    fn strided_views_meet_only_where_rows_do() {
        // Two column tiles of one 8 x 8 tensor: side by side, no byte shared.
        let left = span(0, 8, 4, 8);
        let right = span(16, 8, 4, 8);
        assert!(!left.overlaps(&right) && !right.overlaps(&left));
        // A tile one column wider than the left one meets the right one.
        assert!(span(0, 8, 5, 8).overlaps(&right));
        // Row 3 of the tensor as one row meets both tiles.
        let row = span(3 * 32, 1, 8, 8);
        assert!(row.overlaps(&left) && row.overlaps(&right));
        // A view of every other row (stride 16) misses row 3 ...
        let even = span(0, 4, 8, 16);
        assert!(!even.overlaps(&row));
        // ... and meets row 4.
        assert!(even.overlaps(&span(4 * 32, 1, 8, 8)));
        // Disjoint ranges, and adjacent ones.
        assert!(!span(0, 1, 4, 4).overlaps(&span(16, 1, 4, 4)));
        assert!(span(0, 1, 5, 5).overlaps(&span(16, 1, 4, 4)));
    }
}
