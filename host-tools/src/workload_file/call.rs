//! Kernel calls: the kernel, its arguments' regions and its scalars,
//! resolved and checked as far as they are known before expansion.

use device_runtime::abi::MAX_RANK;
use toml::Spanned;
use wsp_ffi::{KernelInfo, TileShape};

use super::expr::{expr_err, ExprError, Parser, RExpr};
use super::kernels::CHECKED;
use super::raw::{ArgSrc, ExprSrc, RawNode};
use super::resolve::{dtype_text, RRegion, Resolver, Step};
use super::shadow::{arg_what, overlap, overlap_message};
use super::{ErrorKind, FileError};
use crate::table::TensorId;

impl Resolver<'_> {
    pub(super) fn call(&mut self, n: &RawNode, at: usize, stream: u8) -> Result<Step, FileError> {
        let name = n.call.as_ref().expect("the kind's key");
        // Only kernels with an f64 reference: the check could not judge
        // another's result.
        let kernel = wsp_ffi::all()
            .iter()
            .find(|k| k.name == name.get_ref())
            .filter(|k| CHECKED.contains(&k.name));
        let Some(kernel) = kernel else {
            let name_ = name.get_ref();
            let what = if wsp_ffi::all().iter().any(|k| k.name == name_) {
                format!(
                    "kernel `{name_}` has no f64 reference to check a run against, so a \
                     workload file cannot call it"
                )
            } else {
                format!("unknown kernel `{name_}`")
            };
            return Err(self.err(
                ErrorKind::UnknownKernel,
                name.span().start,
                format!(
                    "{what} (kernels a workload file can call: {})",
                    CHECKED.join(", ")
                ),
            ));
        };
        let stream = match &n.stream {
            Some(s) => self.stream_number(s)?,
            None => stream,
        };
        let signature: Vec<&str> = kernel.tensor_args.iter().map(|a| a.name).collect();
        let args = n.args.as_deref().unwrap_or(&[]);
        if args.len() != kernel.num_tensors as usize {
            return Err(self.err(
                ErrorKind::Call,
                at,
                format!(
                    "call {}: {} tensor arguments, the kernel takes {} ({})",
                    kernel.name,
                    args.len(),
                    kernel.num_tensors,
                    signature.join(", ")
                ),
            ));
        }
        let scalars = n.scalars.as_deref().unwrap_or(&[]);
        if scalars.len() != kernel.num_scalars as usize {
            return Err(self.err(
                ErrorKind::Call,
                at,
                format!(
                    "call {}: {} scalars, the kernel takes {}",
                    kernel.name,
                    scalars.len(),
                    kernel.num_scalars
                ),
            ));
        }
        let mut regions = Vec::new();
        for (k, (arg, spec)) in args.iter().zip(kernel.tensor_args).enumerate() {
            let what = arg_what(kernel, k);
            let region = self.region(arg, &what)?;
            let def = &self.tensors[region.tensor.0 as usize];
            if def.dtype != spec.dtype {
                return Err(self.err(
                    ErrorKind::Shape,
                    arg.span().start,
                    format!(
                        "{what}: the kernel takes {}, tensor `{}` is {}",
                        dtype_text(spec.dtype),
                        def.name,
                        dtype_text(def.dtype)
                    ),
                ));
            }
            if spec.access.writes() {
                self.written[region.tensor.0 as usize] = true;
            }
            regions.push(region);
        }
        // Overlapping arguments whose regions are constants are refused
        // here, at the writer; the rest when the reference expands them.
        let consts: Option<Vec<_>> = regions.iter().map(|r| self.constant(r)).collect();
        if let Some(pair) = consts.and_then(|c| overlap(kernel, &c)) {
            let tensor = &self.tensors[regions[pair.0].tensor.0 as usize].name;
            return Err(self.err(
                ErrorKind::Call,
                args[pair.0].span().start,
                overlap_message(kernel, pair, tensor),
            ));
        }
        let mut scalar_exprs = Vec::new();
        for s in scalars {
            scalar_exprs.push(match s.get_ref() {
                // A float scalar is passed as its f32 bits.
                ExprSrc::Float(v) => RExpr::Const((*v as f32).to_bits() as i64),
                _ => self.expr(s, &format!("call {} scalar", kernel.name))?,
            });
        }
        // Sizes known now are checked now; the rest at expansion.
        let consts: Option<Vec<TileShape>> = regions
            .iter()
            .map(|r| match (&r.rows, &r.cols) {
                (RExpr::Const(rows), RExpr::Const(cols)) => Some(TileShape {
                    rows: u32::try_from(*rows).ok()?,
                    cols: u32::try_from(*cols).ok()?,
                    dtype: self.tensors[r.tensor.0 as usize].dtype,
                }),
                _ => None,
            })
            .collect();
        let const_scalars: Option<Vec<u64>> = scalar_exprs
            .iter()
            .map(|s| match s {
                RExpr::Const(v) => Some(*v as u64),
                _ => None,
            })
            .collect();
        if let (Some(shapes), Some(scalars)) = (consts, const_scalars) {
            if let Err(e) = kernel.check(&shapes, &scalars) {
                return Err(self.err(
                    ErrorKind::Shape,
                    at,
                    format!(
                        "call {} ({}): {e}",
                        kernel.name,
                        describe_shapes(kernel, &shapes)
                    ),
                ));
            }
        }
        Ok(Step::Call {
            kernel,
            stream,
            args: regions,
            scalars: scalar_exprs,
            at,
        })
    }

    /// A region's tensor, offset and extent per dimension, if they are
    /// all constants.
    fn constant(&self, r: &RRegion) -> Option<(u32, [u32; MAX_RANK], [u32; MAX_RANK])> {
        let konst = |e: &RExpr| match e {
            RExpr::Const(v) => u32::try_from(*v).ok(),
            _ => None,
        };
        let rank = self.tensors[r.tensor.0 as usize].shape.len();
        if rank == 0 || rank > MAX_RANK || r.offset.len() != rank {
            return None;
        }
        let mut offset = [0u32; MAX_RANK];
        let mut extent = [1u32; MAX_RANK];
        for (o, e) in offset.iter_mut().zip(&r.offset) {
            *o = konst(e)?;
        }
        extent[rank - 1] = konst(&r.cols)?;
        if rank >= 2 {
            extent[rank - 2] = konst(&r.rows)?;
        }
        Some((r.tensor.0, offset, extent))
    }

    pub(super) fn region(
        &mut self,
        arg: &Spanned<ArgSrc>,
        what: &str,
    ) -> Result<RRegion, FileError> {
        let at = arg.span().start;
        match arg.get_ref() {
            ArgSrc::Text(text) => {
                self.expr_base = at;
                self.region_text(text)
                    .map_err(|e| self.expr_error(text, at, what, e))
            }
            ArgSrc::Table(r) => {
                let tensor = self.tensor(&r.tensor, at)?;
                let offset =
                    r.at.iter()
                        .map(|e| self.expr(e, what))
                        .collect::<Result<Vec<_>, _>>()?;
                let rows = match &r.rows {
                    Some(e) => Some(self.expr(e, what)?),
                    None => None,
                };
                let cols = self.expr(&r.cols, what)?;
                self.check_region(tensor, offset, rows, cols)
                    .map_err(|e| self.err(e.kind, at, format!("{what}: {}", e.message)))
            }
        }
    }

    fn region_text(&mut self, text: &str) -> Result<RRegion, ExprError> {
        let mut p = Parser::new(text);
        let Some((name, col)) = p.ident() else {
            return Err(expr_err(
                p.pos,
                "expected a tensor name: t[row, col; rows x cols]",
            ));
        };
        let Some(id) = self.tensors.iter().position(|t| t.name == name) else {
            let known: Vec<&str> = self.tensors.iter().map(|t| t.name.as_str()).collect();
            return Err(ExprError {
                column: col,
                kind: ErrorKind::UnknownTensor,
                message: format!("unknown tensor `{name}` (tensors: {})", known.join(", ")),
            });
        };
        let tensor = TensorId(id as u32);
        if p.peek().is_none() {
            // The whole tensor.
            let shape = self.tensors[id].shape.clone();
            let rank = shape.len();
            if shape[..rank.saturating_sub(2)].iter().any(|&d| d != 1) {
                return Err(expr_err(
                    col,
                    format!(
                        "`{name}` has shape {shape:?}: name the region, {name}[i, j, ..; rows x cols]"
                    ),
                ));
            }
            let rows = if rank >= 2 { shape[rank - 2] } else { 1 };
            return Ok(RRegion {
                tensor,
                offset: vec![RExpr::Const(0); rank],
                rows: RExpr::Const(rows as i64),
                cols: RExpr::Const(shape[rank - 1] as i64),
            });
        }
        p.expect("[", "after the tensor name")?;
        let mut offset = vec![self.resolve(&p.expr()?)?];
        while p.eat(",") {
            offset.push(self.resolve(&p.expr()?)?);
        }
        p.expect(";", "before the region's size (t[row, col; rows x cols])")?;
        let first = self.resolve(&p.expr()?)?;
        // `rows x cols`: the `x` follows a complete expression, so it is
        // never a name.
        let (rows, cols) = if p.peek() == Some(b'x') {
            p.pos += 1;
            (Some(first), self.resolve(&p.expr()?)?)
        } else {
            (None, first)
        };
        p.expect("]", "to close the region")?;
        if p.peek().is_some() {
            return Err(expr_err(
                p.pos,
                format!("unexpected {} after the region", p.found()),
            ));
        }
        self.check_region(tensor, offset, rows, cols)
            .map_err(|mut e| {
                e.column = col;
                e
            })
    }

    /// Offsets per dimension, `rows x cols` for the last two (a rank-1
    /// region has only cols); constant parts are checked against the shape.
    fn check_region(
        &self,
        tensor: TensorId,
        offset: Vec<RExpr>,
        rows: Option<RExpr>,
        cols: RExpr,
    ) -> Result<RRegion, ExprError> {
        let def = &self.tensors[tensor.0 as usize];
        let rank = def.shape.len();
        let shape_err = |m: String| ExprError {
            column: 0,
            kind: ErrorKind::Shape,
            message: m,
        };
        if offset.len() != rank {
            return Err(shape_err(format!(
                "{} offsets for `{}`, a rank-{rank} tensor of shape {:?}",
                offset.len(),
                def.name,
                def.shape
            )));
        }
        let rows = match (rank, rows) {
            (1, Some(_)) => {
                return Err(shape_err(format!(
                    "`{}` has rank 1: its region has one size, t[i; cols]",
                    def.name
                )))
            }
            (1, None) => RExpr::Const(1),
            (_, Some(r)) => r,
            (_, None) => {
                return Err(shape_err(format!(
                    "`{}` has rank {rank}: its region's size is rows x cols",
                    def.name
                )))
            }
        };
        let mut extent = vec![RExpr::Const(1); rank];
        extent[rank - 1] = cols.clone();
        if rank >= 2 {
            extent[rank - 2] = rows.clone();
        }
        for d in 0..rank {
            let o = match &offset[d] {
                RExpr::Const(v) => Some(*v),
                _ => None,
            };
            let e = match &extent[d] {
                RExpr::Const(v) => Some(*v),
                _ => None,
            };
            let dim = def.shape[d] as i64;
            if let Some(e) = e {
                if e < 1 || e > dim {
                    return Err(shape_err(format!(
                        "size {e} in dimension {d} of `{}` (shape {:?})",
                        def.name, def.shape
                    )));
                }
            }
            if let Some(o) = o {
                // An end past i64 is past the shape too.
                let end = o.checked_add(e.unwrap_or(1));
                if o < 0 || end.is_none_or(|end| end > dim) {
                    return Err(shape_err(format!(
                        "offset {o}{} in dimension {d} is outside `{}` (shape {:?})",
                        e.map_or(String::new(), |e| format!(" + size {e}")),
                        def.name,
                        def.shape
                    )));
                }
            }
        }
        Ok(RRegion {
            tensor,
            offset,
            rows,
            cols,
        })
    }
}

pub(super) fn describe_shapes(kernel: &KernelInfo, shapes: &[TileShape]) -> String {
    kernel
        .tensor_args
        .iter()
        .zip(shapes)
        .map(|(a, s)| format!("{} {}x{}", a.name, s.rows, s.cols))
        .collect::<Vec<_>>()
        .join(", ")
}
