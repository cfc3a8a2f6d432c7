//! The kernels' argument contracts, checked on the Rust side so the runtime
//! can reject a descriptor table before any kernel runs. Each rule mirrors a
//! check in `kernels/src/*.cpp`: `KernelInfo::check` accepts exactly the
//! arguments the kernel accepts.

use core::fmt;

use crate::bindings::{WspKernelArgs, WspTensorView, WSP_MAX_TENSOR_ARGS};
use crate::registry::KernelInfo;
use crate::{DTYPE_F32, DTYPE_I32};

/// The shape and element type of one tensor argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileShape {
    /// Rows.
    pub rows: u32,
    /// Columns.
    pub cols: u32,
    /// Element type (`WSP_DTYPE_*`).
    pub dtype: u32,
}

impl From<&WspTensorView> for TileShape {
    fn from(view: &WspTensorView) -> Self {
        Self {
            rows: view.rows,
            cols: view.cols,
            dtype: view.dtype,
        }
    }
}

/// A dimension of a tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    /// The rows.
    Rows,
    /// The columns.
    Cols,
}

impl Dim {
    fn of(self, shape: &TileShape) -> u32 {
        match self {
            Dim::Rows => shape.rows,
            Dim::Cols => shape.cols,
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dim::Rows => "rows",
            Dim::Cols => "cols",
        })
    }
}

/// Why a kernel would reject its arguments. Tensor arguments are numbered
/// from 0 in the kernel's signature order.
#[allow(missing_docs)] // Variant fields: see each variant's doc; their names say the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShapeError {
    /// Wrong number of tensor arguments.
    TensorCount { expected: u32, got: u32 },
    /// Wrong number of scalars.
    ScalarCount { expected: u32, got: u32 },
    /// The argument's element type `dtype` is not the `expected` one.
    Dtype { arg: u32, dtype: u32, expected: u32 },
    /// The argument has zero rows or zero columns.
    Empty { arg: u32 },
    /// The argument is larger than the kernel's tile.
    Capacity {
        arg: u32,
        dim: Dim,
        value: u32,
        max: u32,
    },
    /// `arg`'s `dim` must equal `other`'s `other_dim` plus `plus`.
    Mismatch {
        arg: u32,
        dim: Dim,
        value: u32,
        other: u32,
        other_dim: Dim,
        other_value: u32,
        plus: u32,
    },
    /// Scalar `index` is not a finite, non-negative f32 held in the low 32
    /// bits with the high 32 bits zero.
    Scalar { index: u32, value: u64 },
    /// Scalar `index` is not in `1..=max`.
    Bounded { index: u32, value: u64, max: u64 },
    /// Scalar `index` does not hold two halves of 32 bits each below `max`.
    Halves { index: u32, value: u64, max: u32 },
    /// Scalar `index`, a top-k count `k`, is not in `1..=max`, `max` being
    /// the cols of tensor argument `arg`.
    TopK {
        index: u32,
        k: u64,
        arg: u32,
        max: u32,
    },
    /// Scalar `index` is not a threshold: an f32 in [0, 1) held in the low
    /// 32 bits with the high 32 bits zero.
    Threshold { index: u32, value: u64 },
    /// `arg`'s cols `value` are fewer than `min`: the rows of tensor argument
    /// `rows_of` times scalar `scalar`.
    TooFewCols {
        arg: u32,
        value: u32,
        min: u64,
        rows_of: u32,
        scalar: u32,
    },
    /// Scalar `index`, a count, is 0 or more than `max`, the cols of tensor
    /// argument `arg` (`max` is `u32::MAX` and `arg` unused when the count
    /// has no upper bound).
    Count {
        index: u32,
        value: u64,
        arg: u32,
        max: u32,
    },
    /// Scalar `index`, a page size, is 0 or does not divide tensor argument
    /// `arg`'s `rows` (a paged KV pool) into pages of 2 x `value` rows.
    PageSize {
        index: u32,
        value: u64,
        arg: u32,
        rows: u32,
    },
    /// Scalar `index` is not an attention scale: a finite f32 held in the
    /// low 32 bits with the high 32 bits zero.
    Scale { index: u32, value: u64 },
    /// Scalar `index`, a number of partial states `n`, is 0 or `n` times the
    /// rows of tensor argument `out` (`out_rows`) is not the rows of tensor
    /// argument `arg` (`rows`).
    States {
        index: u32,
        n: u64,
        arg: u32,
        rows: u32,
        out: u32,
        out_rows: u32,
    },
    /// Scalar `index`, a top-k count `k`, is not in `1..=max` (`max` = the
    /// cols of tensor argument `arg`, at most 2048), or tensor argument
    /// `idx` has `idx_cols` cols, not k.
    Select {
        index: u32,
        k: u64,
        arg: u32,
        max: u32,
        idx: u32,
        idx_cols: u32,
    },
    /// The tokens up to `last` (from scalars `first` and `count`, page size
    /// scalar `page`, `last` = `u64::MAX` on overflow) need page table entry
    /// `entry`, beyond the `cols` entries of the page table (row 0 of tensor
    /// argument `table`): a length above the page table.
    Span {
        count: u32,
        last: u64,
        entry: u64,
        table: u32,
        cols: u32,
    },
    /// Tensor argument `arg`'s cols `value` are neither `other_value` (a
    /// partial state) nor `other_value` - 2 (its output only), the cols of
    /// tensor argument `other`, which must be at least 3.
    StateCols {
        arg: u32,
        value: u32,
        other: u32,
        other_value: u32,
    },
    /// Tensor argument `arg` has `value` rows where the kernel takes exactly
    /// `expected`.
    Rows { arg: u32, value: u32, expected: u32 },
    /// Tensor argument `arg` holds `value` elements where tensor argument
    /// `other` holds `other_value` (the kernel moves one into the other), or
    /// more than `max`.
    Elements {
        arg: u32,
        value: u64,
        other: u32,
        other_value: u64,
        max: u64,
    },
    /// Tensor argument `arg` (`rows` x `cols`) is neither the shape of tensor
    /// argument `heads` (`n` x `d`) nor one row of its `n * d` elements.
    Heads {
        arg: u32,
        rows: u32,
        cols: u32,
        heads: u32,
        n: u32,
        d: u32,
    },
    /// Tensor argument `arg` has an odd number of cols, `value`: the kernel
    /// pairs column `i` with column `i + cols / 2`.
    OddCols { arg: u32, value: u32 },
}

/// The name of a `WSP_DTYPE_*` value, if it is one.
fn dtype_name(dtype: u32) -> Option<&'static str> {
    match dtype {
        DTYPE_F32 => Some("f32"),
        DTYPE_I32 => Some("i32"),
        _ => None,
    }
}

/// `dtype` as "7" or, for a known dtype, "2 (i32)".
struct DtypeText(u32);

impl fmt::Display for DtypeText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match dtype_name(self.0) {
            Some(name) => write!(f, "{} ({name})", self.0),
            None => write!(f, "{}", self.0),
        }
    }
}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::TensorCount { expected, got } => {
                write!(f, "expected {expected} tensor arguments, got {got}")
            }
            Self::ScalarCount { expected, got } => {
                write!(f, "expected {expected} scalars, got {got}")
            }
            Self::Dtype {
                arg,
                dtype,
                expected,
            } => write!(
                f,
                "tensor argument {arg}: dtype {} where the kernel takes dtype {}",
                DtypeText(dtype),
                DtypeText(expected)
            ),
            Self::Empty { arg } => write!(f, "tensor argument {arg}: rows and cols must be > 0"),
            Self::Capacity {
                arg,
                dim,
                value,
                max,
            } => {
                write!(
                    f,
                    "tensor argument {arg}: {dim} {value} exceeds the capacity max {max}"
                )
            }
            Self::Mismatch {
                arg,
                dim,
                value,
                other,
                other_dim,
                other_value,
                plus,
            } => {
                write!(
                    f,
                    "tensor argument {arg}: {dim} {value} must equal {other_dim} {other_value} "
                )?;
                if plus != 0 {
                    write!(f, "+ {plus} ")?;
                }
                write!(f, "of tensor argument {other}")
            }
            Self::Bounded { index, value, max } => {
                write!(f, "scalar {index}: {value} is outside 1..={max}")
            }
            Self::Halves { index, value, max } => write!(
                f,
                "scalar {index}: {value:#x} must hold two 32-bit halves, each below {max}"
            ),
            Self::Scalar { index, value } => write!(
                f,
                "scalar {index}: {value:#x} is not a finite non-negative f32 in the low 32 bits"
            ),
            Self::TopK { index, k, arg, max } => write!(
                f,
                "scalar {index}: k {k} is not in 1..={max} (the cols of tensor argument {arg})"
            ),
            Self::Threshold { index, value } => write!(
                f,
                "scalar {index}: {value:#x} is not an f32 threshold in [0, 1) in the low 32 bits"
            ),
            Self::TooFewCols {
                arg,
                value,
                min,
                rows_of,
                scalar,
            } => write!(
                f,
                "tensor argument {arg}: cols {value} are fewer than {min}, \
                 the rows of tensor argument {rows_of} times scalar {scalar}"
            ),
            Self::Count {
                index,
                value,
                arg,
                max,
            } => {
                if max == u32::MAX {
                    write!(f, "scalar {index}: count {value} must be at least 1")
                } else {
                    write!(
                        f,
                        "scalar {index}: count {value} is not in 1..={max} \
                         (the cols of tensor argument {arg})"
                    )
                }
            }
            Self::PageSize {
                index,
                value,
                arg,
                rows,
            } => write!(
                f,
                "scalar {index}: page size {value} must be at least 1 and split the rows {rows} \
                 of tensor argument {arg} (the KV pool) into pages of 2 x {value} rows"
            ),
            Self::Scale { index, value } => write!(
                f,
                "scalar {index}: {value:#x} is not a finite f32 scale in the low 32 bits"
            ),
            Self::States {
                index,
                n,
                arg,
                rows,
                out,
                out_rows,
            } => write!(
                f,
                "scalar {index}: {n} partial states of the rows {out_rows} of tensor argument \
                 {out} do not fill the rows {rows} of tensor argument {arg} (n must be >= 1)"
            ),
            Self::Select {
                index,
                k,
                arg,
                max,
                idx,
                idx_cols,
            } => write!(
                f,
                "scalar {index}: k {k} must be in 1..={max} (the cols of tensor argument {arg}, \
                 at most {}) and equal the cols {idx_cols} of tensor argument {idx}",
                crate::registry::MAX_TOPK
            ),
            Self::Span {
                count,
                last,
                entry,
                table,
                cols,
            } => {
                if last == u64::MAX {
                    write!(f, "scalar {count}: the token range overflows")
                } else {
                    write!(
                        f,
                        "scalar {count}: a length above the page table: token {last} is on \
                         page table entry {entry}, beyond the {cols} entries of tensor \
                         argument {table}"
                    )
                }
            }
            Self::StateCols {
                arg,
                value,
                other,
                other_value,
            } => write!(
                f,
                "tensor argument {arg}: cols {value} must equal cols {other_value} of tensor \
                 argument {other} (a partial state) or {other_value} - 2 (the output only), \
                 with {other_value} >= 3"
            ),
            Self::Rows {
                arg,
                value,
                expected,
            } => write!(
                f,
                "tensor argument {arg}: rows {value} where the kernel takes exactly {expected}"
            ),
            Self::Elements {
                arg,
                value,
                other,
                other_value,
                max,
            } => write!(
                f,
                "tensor argument {arg} holds {value} elements, tensor argument {other} \
                 {other_value}: they must be equal and at most {max}"
            ),
            Self::Heads {
                arg,
                rows,
                cols,
                heads,
                n,
                d,
            } => write!(
                f,
                "tensor argument {arg} is {rows} x {cols}: it must be {n} x {d} like tensor \
                 argument {heads}, or 1 x {}",
                u64::from(n) * u64::from(d)
            ),
            Self::OddCols { arg, value } => write!(
                f,
                "tensor argument {arg}: cols {value} must be even (column i pairs with \
                 column i + cols / 2)"
            ),
        }
    }
}

/// A rule "`arg`'s `dim` equals `other`'s `other_dim` plus `plus`".
#[derive(Clone, Copy, Debug)]
pub(crate) struct Equal {
    arg: u32,
    dim: Dim,
    other: u32,
    other_dim: Dim,
    plus: u32,
}

impl Equal {
    /// `arg`'s `dim` equals `other`'s `other_dim`.
    pub(crate) const fn new(arg: u32, dim: Dim, other: u32, other_dim: Dim) -> Self {
        Self {
            arg,
            dim,
            other,
            other_dim,
            plus: 0,
        }
    }

    /// The same rule with `plus` added to the other side.
    pub(crate) const fn plus(self, plus: u32) -> Self {
        Self { plus, ..self }
    }
}

/// What a scalar must hold.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ScalarRule {
    /// An epsilon: f32 bits in the low 32 bits, high bits zero, finite, >= 0.
    Eps,
    /// A top-k count k: 1 <= k <= the cols of tensor argument `logits`, and
    /// the cols of tensor argument `slots` are at least the rows of `logits`
    /// times k.
    TopK { logits: u32, slots: u32 },
    /// A threshold: f32 bits in the low 32 bits, high bits zero, 0 <= t < 1
    /// (so finite; -0 counts as 0).
    Threshold,
    /// Any value (a first token, bounded by a [`Span`]).
    Start,
    /// A count >= 1, and at most the cols of tensor argument `at_most_cols_of`
    /// when given.
    Count { at_most_cols_of: Option<u32> },
    /// A page size P >= 1 with the rows of tensor argument `pool` a multiple
    /// of 2P.
    PageSize { pool: u32 },
    /// An attention scale: f32 bits in the low 32 bits, high bits zero, finite.
    Scale,
    /// A number of partial states n >= 1 with the rows of tensor argument
    /// `parts` equal to n times the rows of tensor argument `out`.
    States { parts: u32, out: u32 },
    /// A top-k count k with 1 <= k <= min(the cols of tensor argument
    /// `scores`, `MAX_TOPK`) and the cols of tensor argument `idx` equal to k.
    Select { scores: u32, idx: u32 },
    /// A value in `1..=max`.
    AtMost(u64),
    /// Two 32-bit halves (low, high), each below the bound.
    Halves(u32),
}

/// A rule checked after every scalar's own rule.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Extra {
    /// Tokens `first` .. `first + count` (scalars; `first` 0 when `None`)
    /// lie in the page table, row 0 of tensor argument `table`, of pages of
    /// scalar `page` tokens: (first + count - 1) / page < the table's cols.
    Span {
        first: Option<u32>,
        count: u32,
        page: u32,
        table: u32,
    },
    /// Tensor argument `out`'s cols equal tensor argument `parts`' cols (a
    /// partial state) or those minus 2 (its o only), and `parts` has at
    /// least 3 cols.
    StateCols { out: u32, parts: u32 },
    /// Tensor argument `arg` has exactly `rows` rows.
    Rows { arg: u32, rows: u32 },
    /// Tensor arguments `arg` and `other` hold the same number of elements,
    /// at most `max`.
    Elements { arg: u32, other: u32, max: u64 },
    /// Tensor argument `arg` has the shape of tensor argument `heads` or is
    /// one row of the same number of elements.
    Heads { arg: u32, heads: u32 },
    /// Tensor argument `arg` has an even number of cols.
    EvenCols { arg: u32 },
}

impl Extra {
    /// Checks the rule against the `views` and `scalars`, which have passed
    /// every other check.
    fn check(self, views: &[TileShape], scalars: &[u64]) -> Result<(), ShapeError> {
        match self {
            Self::Span {
                first,
                count,
                page,
                table,
            } => {
                let start = first.map_or(0, |i| scalars[i as usize]);
                let cols = views[table as usize].cols;
                // count >= 1 and page >= 1: their own rules passed.
                let last = start.checked_add(scalars[count as usize] - 1);
                let entry = last.map_or(u64::MAX, |last| last / scalars[page as usize]);
                if entry < u64::from(cols) {
                    return Ok(());
                }
                Err(ShapeError::Span {
                    count,
                    last: last.unwrap_or(u64::MAX),
                    entry,
                    table,
                    cols,
                })
            }
            Self::StateCols { out, parts } => {
                let (value, other_value) = (views[out as usize].cols, views[parts as usize].cols);
                if other_value >= 3 && (value == other_value || value == other_value - 2) {
                    Ok(())
                } else {
                    Err(ShapeError::StateCols {
                        arg: out,
                        value,
                        other: parts,
                        other_value,
                    })
                }
            }
            Self::Elements { arg, other, max } => {
                let count = |i: u32| {
                    let v = &views[i as usize];
                    u64::from(v.rows) * u64::from(v.cols)
                };
                let (value, other_value) = (count(arg), count(other));
                if value == other_value && value <= max {
                    Ok(())
                } else {
                    Err(ShapeError::Elements {
                        arg,
                        value,
                        other,
                        other_value,
                        max,
                    })
                }
            }
            Self::Heads { arg, heads } => {
                let (x, y) = (views[arg as usize], views[heads as usize]);
                let one_row =
                    x.rows == 1 && u64::from(x.cols) == u64::from(y.rows) * u64::from(y.cols);
                if (x.rows == y.rows && x.cols == y.cols) || one_row {
                    Ok(())
                } else {
                    Err(ShapeError::Heads {
                        arg,
                        rows: x.rows,
                        cols: x.cols,
                        heads,
                        n: y.rows,
                        d: y.cols,
                    })
                }
            }
            Self::EvenCols { arg } => {
                let value = views[arg as usize].cols;
                if value.is_multiple_of(2) {
                    Ok(())
                } else {
                    Err(ShapeError::OddCols { arg, value })
                }
            }
            Self::Rows { arg, rows } => {
                let value = views[arg as usize].rows;
                if value == rows {
                    Ok(())
                } else {
                    Err(ShapeError::Rows {
                        arg,
                        value,
                        expected: rows,
                    })
                }
            }
        }
    }
}

impl ScalarRule {
    /// Checks scalar `index`, holding `value`, against the tensor `views`
    /// (whose shapes have passed every other check).
    fn check(self, index: u32, value: u64, views: &[TileShape]) -> Result<(), ShapeError> {
        match self {
            Self::Eps => {
                let eps = f32::from_bits(value as u32);
                if value >> 32 == 0 && eps.is_finite() && eps >= 0.0 {
                    Ok(())
                } else {
                    Err(ShapeError::Scalar { index, value })
                }
            }
            Self::TopK { logits, slots } => {
                let (logits_shape, slots_shape) = (&views[logits as usize], &views[slots as usize]);
                let max = logits_shape.cols;
                if !(1..=u64::from(max)).contains(&value) {
                    return Err(ShapeError::TopK {
                        index,
                        k: value,
                        arg: logits,
                        max,
                    });
                }
                // k <= u32::MAX here, so the product cannot overflow.
                let min = u64::from(logits_shape.rows) * value;
                if u64::from(slots_shape.cols) < min {
                    return Err(ShapeError::TooFewCols {
                        arg: slots,
                        value: slots_shape.cols,
                        min,
                        rows_of: logits,
                        scalar: index,
                    });
                }
                Ok(())
            }
            Self::Threshold => {
                let t = f32::from_bits(value as u32);
                if value >> 32 == 0 && (0.0..1.0).contains(&t) {
                    Ok(())
                } else {
                    Err(ShapeError::Threshold { index, value })
                }
            }
            Self::Start => Ok(()),
            Self::AtMost(max) => {
                if (1..=max).contains(&value) {
                    Ok(())
                } else {
                    Err(ShapeError::Bounded { index, value, max })
                }
            }
            Self::Halves(max) => {
                if (value as u32) < max && ((value >> 32) as u32) < max {
                    Ok(())
                } else {
                    Err(ShapeError::Halves { index, value, max })
                }
            }
            Self::Count { at_most_cols_of } => {
                let (arg, max) =
                    at_most_cols_of.map_or((0, u32::MAX), |arg| (arg, views[arg as usize].cols));
                if (1..=u64::from(max)).contains(&value) {
                    Ok(())
                } else {
                    Err(ShapeError::Count {
                        index,
                        value,
                        arg,
                        max,
                    })
                }
            }
            Self::PageSize { pool } => {
                let rows = views[pool as usize].rows;
                if value >= 1 && value <= u64::from(rows / 2) && u64::from(rows) % (2 * value) == 0
                {
                    Ok(())
                } else {
                    Err(ShapeError::PageSize {
                        index,
                        value,
                        arg: pool,
                        rows,
                    })
                }
            }
            Self::Scale => {
                if value >> 32 == 0 && f32::from_bits(value as u32).is_finite() {
                    Ok(())
                } else {
                    Err(ShapeError::Scale { index, value })
                }
            }
            Self::States { parts, out } => {
                let (rows, out_rows) = (views[parts as usize].rows, views[out as usize].rows);
                if value >= 1 && value.checked_mul(u64::from(out_rows)) == Some(u64::from(rows)) {
                    Ok(())
                } else {
                    Err(ShapeError::States {
                        index,
                        n: value,
                        arg: parts,
                        rows,
                        out,
                        out_rows,
                    })
                }
            }
            Self::Select { scores, idx } => {
                let max = views[scores as usize].cols.min(crate::registry::MAX_TOPK);
                let idx_cols = views[idx as usize].cols;
                if (1..=u64::from(max)).contains(&value) && u64::from(idx_cols) == value {
                    Ok(())
                } else {
                    Err(ShapeError::Select {
                        index,
                        k: value,
                        arg: scores,
                        max,
                        idx,
                        idx_cols,
                    })
                }
            }
        }
    }
}

impl KernelInfo {
    /// Checks argument shapes and scalars against the kernel's contract:
    /// counts, each argument's dtype, non-empty, within capacity, the shape
    /// equalities between arguments, the scalars' values (some of which
    /// bound shapes, as a top-k count does), then the rules over several
    /// scalars and shapes (a token range inside its page table).
    pub fn check(&self, views: &[TileShape], scalars: &[u64]) -> Result<(), ShapeError> {
        let got = u32::try_from(views.len()).unwrap_or(u32::MAX);
        if got != self.num_tensors {
            return Err(ShapeError::TensorCount {
                expected: self.num_tensors,
                got,
            });
        }
        let got = u32::try_from(scalars.len()).unwrap_or(u32::MAX);
        if got != self.num_scalars {
            return Err(ShapeError::ScalarCount {
                expected: self.num_scalars,
                got,
            });
        }
        for (arg, (shape, spec)) in (0u32..).zip(views.iter().zip(self.tensor_args)) {
            if shape.dtype != spec.dtype {
                return Err(ShapeError::Dtype {
                    arg,
                    dtype: shape.dtype,
                    expected: spec.dtype,
                });
            }
            if shape.rows == 0 || shape.cols == 0 {
                return Err(ShapeError::Empty { arg });
            }
            for (dim, max) in [(Dim::Rows, spec.max_rows), (Dim::Cols, spec.max_cols)] {
                let value = dim.of(shape);
                if value > max {
                    return Err(ShapeError::Capacity {
                        arg,
                        dim,
                        value,
                        max,
                    });
                }
            }
        }
        for rule in self.equal {
            let value = rule.dim.of(&views[rule.arg as usize]);
            let other_value = rule.other_dim.of(&views[rule.other as usize]);
            if u64::from(value) != u64::from(other_value) + u64::from(rule.plus) {
                return Err(ShapeError::Mismatch {
                    arg: rule.arg,
                    dim: rule.dim,
                    value,
                    other: rule.other,
                    other_dim: rule.other_dim,
                    other_value,
                    plus: rule.plus,
                });
            }
        }
        for (index, (&value, rule)) in (0u32..).zip(scalars.iter().zip(self.scalars)) {
            rule.check(index, value, views)?;
        }
        for rule in self.extra {
            rule.check(views, scalars)?;
        }
        Ok(())
    }

    /// [`check`](Self::check) on an argument block as the kernel would see it.
    pub fn check_args(&self, args: &WspKernelArgs) -> Result<(), ShapeError> {
        if args.num_tensors > WSP_MAX_TENSOR_ARGS {
            return Err(ShapeError::TensorCount {
                expected: self.num_tensors,
                got: args.num_tensors,
            });
        }
        let scalars =
            args.scalars
                .get(..args.num_scalars as usize)
                .ok_or(ShapeError::ScalarCount {
                    expected: self.num_scalars,
                    got: args.num_scalars,
                })?;
        let mut shapes = [TileShape {
            rows: 0,
            cols: 0,
            dtype: 0,
        }; WSP_MAX_TENSOR_ARGS as usize];
        let n = args.num_tensors as usize;
        for (shape, view) in shapes.iter_mut().zip(&args.tensors[..n]) {
            *shape = view.into();
        }
        self.check(&shapes[..n], scalars)
    }
}
