//! The kernels' argument contracts, checked on the Rust side so the runtime
//! can reject a descriptor table before any kernel runs. Each rule mirrors a
//! check in `kernels/src/*.cpp`: `KernelInfo::check` accepts exactly the
//! arguments the kernel accepts.

use core::fmt;

use crate::bindings::{WspKernelArgs, WspTensorView, WSP_MAX_TENSOR_ARGS};
use crate::registry::KernelInfo;
use crate::DTYPE_F32;

/// The shape and element type of one tensor argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileShape {
    pub rows: u32,
    pub cols: u32,
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
    Rows,
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShapeError {
    /// Wrong number of tensor arguments.
    TensorCount { expected: u32, got: u32 },
    /// Wrong number of scalars.
    ScalarCount { expected: u32, got: u32 },
    /// The argument's element type is not f32.
    Dtype { arg: u32, dtype: u32 },
    /// The argument has zero rows or zero columns.
    Empty { arg: u32 },
    /// The argument is larger than the kernel's tile.
    Capacity {
        arg: u32,
        dim: Dim,
        value: u32,
        max: u32,
    },
    /// `arg`'s `dim` must equal `other`'s `other_dim`.
    Mismatch {
        arg: u32,
        dim: Dim,
        value: u32,
        other: u32,
        other_dim: Dim,
        other_value: u32,
    },
    /// Scalar `index` is not a finite, non-negative f32 held in the low 32
    /// bits with the high 32 bits zero.
    Scalar { index: u32, value: u64 },
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
            Self::Dtype { arg, dtype } => {
                write!(
                    f,
                    "tensor argument {arg}: dtype {dtype} is not f32 ({DTYPE_F32})"
                )
            }
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
            } => write!(
                f,
                "tensor argument {arg}: {dim} {value} must equal {other_dim} {other_value} \
                 of tensor argument {other}"
            ),
            Self::Scalar { index, value } => write!(
                f,
                "scalar {index}: {value:#x} is not a finite non-negative f32 in the low 32 bits"
            ),
        }
    }
}

/// A rule "`arg`'s `dim` equals `other`'s `other_dim`".
#[derive(Clone, Copy, Debug)]
pub(crate) struct Equal {
    arg: u32,
    dim: Dim,
    other: u32,
    other_dim: Dim,
}

impl Equal {
    pub(crate) const fn new(arg: u32, dim: Dim, other: u32, other_dim: Dim) -> Self {
        Self {
            arg,
            dim,
            other,
            other_dim,
        }
    }
}

/// What a scalar must hold.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ScalarRule {
    /// An epsilon: f32 bits in the low 32 bits, high bits zero, finite, >= 0.
    Eps,
}

impl ScalarRule {
    fn accepts(self, value: u64) -> bool {
        match self {
            Self::Eps => {
                let eps = f32::from_bits(value as u32);
                value >> 32 == 0 && eps.is_finite() && eps >= 0.0
            }
        }
    }
}

impl KernelInfo {
    /// Checks argument shapes and scalars against the kernel's contract:
    /// counts, f32 dtype, non-empty, within capacity, the shape equalities
    /// between arguments, and the scalars' values.
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
            if shape.dtype != DTYPE_F32 {
                return Err(ShapeError::Dtype {
                    arg,
                    dtype: shape.dtype,
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
            if value != other_value {
                return Err(ShapeError::Mismatch {
                    arg: rule.arg,
                    dim: rule.dim,
                    value,
                    other: rule.other,
                    other_dim: rule.other_dim,
                    other_value,
                });
            }
        }
        for (index, (&value, rule)) in (0u32..).zip(scalars.iter().zip(self.scalars)) {
            if !rule.accepts(value) {
                return Err(ShapeError::Scalar { index, value });
            }
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
