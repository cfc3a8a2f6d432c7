//! Lowering the resolved program onto the workload language.

use device_runtime::abi::program::{
    OP_ADD, OP_DIV, OP_LE, OP_LT, OP_MAX, OP_MIN, OP_MUL, OP_REM, OP_SUB,
};

use super::expr::RExpr;
use super::resolve::{Kind, RAxis, Step};
use crate::program::{Axis, Channel, Expr, Region, Workload as Program};

fn to_expr(e: &RExpr, env: &[Expr]) -> Expr {
    match e {
        RExpr::Const(v) => Expr::Const(*v),
        RExpr::Slot(s) => env[*s].clone(),
        RExpr::Symbol(s) => Expr::Symbol(*s),
        RExpr::Load(t, index) => Expr::load(*t, index.iter().map(|i| to_expr(i, env)).collect()),
        RExpr::Bin(op, a, b) => {
            let (a, b) = (to_expr(a, env), to_expr(b, env));
            match *op {
                OP_ADD => a + b,
                OP_SUB => a - b,
                OP_MUL => a * b,
                OP_DIV => a / b,
                OP_REM => a % b,
                OP_MIN => a.min(b),
                OP_MAX => a.max(b),
                OP_LT => a.lt(b),
                OP_LE => a.le(b),
                _ => a.equals(b),
            }
        }
    }
}

fn to_axis(axis: &RAxis, env: &[Expr]) -> Axis {
    match axis {
        RAxis::Dense(n) => Axis::Dense(*n),
        RAxis::DenseDyn { symbol, max } => Axis::DenseDyn {
            symbol: *symbol,
            max: *max,
        },
        RAxis::Ragged { lengths, at, max } => Axis::Ragged {
            lengths: *lengths,
            at: at.iter().map(|e| to_expr(e, env)).collect(),
            max: *max,
        },
    }
}

/// Lowers `steps` with `env` holding the workload language's value of
/// each slot in scope.
pub(super) fn lower(w: &mut Program, steps: &[Step], env: &mut Vec<Expr>, channels: &[Channel]) {
    let depth = env.len();
    for step in steps {
        match step {
            Step::Loop {
                kind, axis, body, ..
            } => {
                let axis = to_axis(axis, env);
                let inner = |w: &mut Program, i: Expr| {
                    env.push(i);
                    lower(w, body, env, channels);
                    env.pop();
                };
                match kind {
                    Kind::Parallel => w.parallel(axis, inner),
                    Kind::Sequential => w.sequential(axis, inner),
                }
            }
            Step::Select {
                indptr,
                indices,
                row,
                max,
                body,
                ..
            } => {
                let row = to_expr(row, env);
                w.select(*indptr, *indices, row, *max, |w, j, value| {
                    env.push(j);
                    env.push(value);
                    lower(w, body, env, channels);
                    env.truncate(env.len() - 2);
                });
            }
            Step::When {
                cond,
                then,
                otherwise,
                ..
            } => {
                let cond = to_expr(cond, env);
                let (mut e1, mut e2) = (env.clone(), env.clone());
                w.when(
                    cond,
                    |w| lower(w, then, &mut e1, channels),
                    |w| lower(w, otherwise, &mut e2, channels),
                );
            }
            Step::Let { value, .. } => {
                let v = w.let_(to_expr(value, env));
                env.push(v);
            }
            Step::Call {
                kernel,
                stream,
                args,
                scalars,
                ..
            } => {
                let regions: Vec<Region> = args
                    .iter()
                    .map(|r| Region {
                        tensor: r.tensor,
                        offset: r.offset.iter().map(|o| to_expr(o, env)).collect(),
                        rows: to_expr(&r.rows, env),
                        cols: to_expr(&r.cols, env),
                    })
                    .collect();
                let scalars: Vec<Expr> = scalars.iter().map(|s| to_expr(s, env)).collect();
                w.on_stream(*stream, |w| {
                    w.call(kernel.id, &regions, &scalars);
                });
            }
            Step::Stream { stream, body } => {
                w.on_stream(*stream, |w| {
                    let depth = env.len();
                    lower(w, body, env, channels);
                    env.truncate(depth);
                });
            }
            Step::Dispatch { schedule, body, .. } => {
                w.dispatch(schedule.policy, schedule.key, |w| {
                    let depth = env.len();
                    lower(w, body, env, channels);
                    env.truncate(depth);
                });
            }
            Step::Process { name, axis, body } => match axis {
                Some(axis) => w.process_over(name, to_axis(axis, env), |w, i| {
                    env.push(i);
                    lower(w, body, env, channels);
                    env.pop();
                }),
                None => w.process(name, |w| {
                    let depth = env.len();
                    lower(w, body, env, channels);
                    env.truncate(depth);
                }),
            },
            // The resolver checked that the send follows a call of its
            // process; the workload language checks it again.
            Step::Send { channel, value } => {
                let value = to_expr(value, env);
                w.send_after_last_call(channels[*channel as usize], value);
            }
            Step::Consume { channel, body } => {
                w.consume(channels[*channel as usize], |w, t| {
                    env.push(t);
                    lower(w, body, env, channels);
                    env.pop();
                });
            }
            Step::Close { channel } => w.close(channels[*channel as usize]),
            Step::Free { tensor } => w.free(*tensor),
            Step::Event {
                record,
                stream,
                event,
            } => {
                if *record {
                    w.record_event(*stream, *event);
                } else {
                    w.wait_event(*stream, *event);
                }
            }
        }
    }
    env.truncate(depth);
}
