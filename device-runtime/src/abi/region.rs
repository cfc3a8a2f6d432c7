//! Regions of tensors: hyper-rectangles, their overlap test and their 2-D tile view.

use super::layout::{TensorArg, TensorDesc, MAX_RANK};

/// A hyper-rectangle `offset[d] .. offset[d] + extent[d]` per dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// First index per dimension.
    pub offset: [u32; MAX_RANK],
    /// Elements per dimension (1 past the tensor's rank).
    pub extent: [u32; MAX_RANK],
}

impl Region {
    /// The region of a (validated or not) argument, in native integers.
    pub fn of(arg: &TensorArg) -> Region {
        Region {
            offset: arg.offset.map(|v| v.get()),
            extent: arg.extent.map(|v| v.get()),
        }
    }

    /// Exact overlap test of two hyper-rectangles of the same tensor: they share
    /// an element iff their intervals intersect in every dimension.
    #[inline]
    pub fn overlaps(&self, other: &Region) -> bool {
        // Branch-free over the dimensions: `a0 < b1` iff `a0 - b1` is
        // negative (in i64 the values, below 2^33, cannot overflow), so one
        // AND of differences carries every test in its sign bit.
        let mut all = -1i64;
        for d in 0..MAX_RANK {
            let (a0, b0) = (self.offset[d] as i64, other.offset[d] as i64);
            let (a1, b1) = (a0 + self.extent[d] as i64, b0 + other.extent[d] as i64);
            all &= (a0 - b1) & (b0 - a1);
        }
        all < 0
    }
}

/// The 2-D view a kernel sees of a validated region: `rows` x `cols` elements
/// starting `first_element` elements into the tensor, rows `row_stride` apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileView {
    /// Element index of the tile's first element in its tensor.
    pub first_element: u64,
    /// Rows of the tile.
    pub rows: u32,
    /// Columns of the tile.
    pub cols: u32,
    /// Elements from one row to the next.
    pub row_stride: u32,
}

impl TileView {
    /// Only meaningful for a region validated against `tensor` (see `validate`).
    pub fn of(tensor: &TensorDesc, region: &Region) -> TileView {
        let rank = tensor.rank.get() as usize;
        let first_element = (0..rank)
            .map(|d| region.offset[d] as u64 * tensor.strides[d].get() as u64)
            .sum();
        let cols = region.extent[rank - 1];
        let (rows, row_stride) = if rank >= 2 {
            (region.extent[rank - 2], tensor.strides[rank - 2].get())
        } else {
            (1, cols)
        };
        TileView {
            first_element,
            rows,
            cols,
            row_stride,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(offset: [u32; 4], extent: [u32; 4]) -> Region {
        Region { offset, extent }
    }

    #[test]
    fn overlap_needs_every_dimension() {
        let a = r([0, 0, 0, 0], [1, 1, 4, 4]);
        assert!(a.overlaps(&r([0, 0, 3, 3], [1, 1, 4, 4])));
        assert!(
            !a.overlaps(&r([0, 0, 4, 0], [1, 1, 4, 4])),
            "touching edges do not overlap"
        );
        assert!(!a.overlaps(&r([0, 0, 0, 4], [1, 1, 4, 4])));
        assert!(
            !a.overlaps(&r([0, 1, 0, 0], [1, 1, 4, 4])),
            "different outer index"
        );
    }

    #[test]
    fn overlap_does_not_overflow() {
        let big = r([u32::MAX, 0, 0, 0], [u32::MAX, 1, 1, 1]);
        assert!(big.overlaps(&big));
    }
}
