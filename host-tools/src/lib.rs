//! The pto-wsp host toolkit.
//!
//! - [`table`]: `TableBuilder` writes descriptor tables; `Arena` holds tensor data.
//! - [`program`]: the workload language (axes, loops, calls), lowered to
//!   the table's program that the device expands.
//! - [`program_examples`]: small programs, one per axis and loop kind, with
//!   checks against the host's reference expansion (shim and QEMU tests).
//! - [`workloads`]: named workloads (GEMM, a block using every kernel) with
//!   their f64 checks, [`budget`] the bounds on their sizes;
//!   [`reference`](mod@reference) holds the f64 math;
//!   [`pipeline`] is the CSP pipeline (processes over token channels);
//!   [`model`] the transformer decode layer.
//! - [`dag`]: random DAG tables and their in-order meaning (scheduling tests).
//! - [`shim`]: runs the device runtime on host threads.
//! - [`inspect`]: a readable dump of any table, valid or not;
//!   [`task_count`] counts a table's tasks in bounded work.

#![warn(missing_docs)]

pub mod asm;
pub mod attention;
pub mod attention_pipeline;
pub mod bound;
pub mod budget;
pub mod dag;
pub mod heap;
pub mod inspect;
pub mod model;
pub mod moe;
pub mod moe_layer;
pub mod pinning;
pub mod pipeline;
pub mod plot;
pub mod program;
pub mod program_examples;
pub mod progress;
pub mod record;
pub mod reference;
pub mod rng;
pub mod semantic;
pub mod shim;
pub mod summary;
pub mod table;
pub mod task_count;
pub mod trace;
pub mod workers;
pub mod workload_file;
pub mod workloads;
pub mod wsp9;
