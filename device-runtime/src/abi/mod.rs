//! Descriptor table ABI v3: the host -> device contract.
//!
//! The host builds a table (see `host-tools`), the device parses it in place
//! with [`Table::parse`], which validates every byte it will later rely on. A
//! table that parses is safe to execute: every kernel id is known, every
//! region lies inside its tensor and every tensor inside the arena.

mod checksum;
mod error;
pub mod launch;
mod layout;
mod limits;
pub mod memory_map;
pub mod program;
mod region;
pub mod schedule;
mod validate;

pub use checksum::{table_checksum, CHECKSUM_FIELD};
pub use error::{Problem, Section, TableError};
pub use layout::*;
pub use limits::{MAX_SCRATCH, MAX_TENSORS, TASK_WINDOW};
pub use program::ProgramInfo;
pub use region::{Region, TileView};
pub use validate::{
    check_region, dtype_size, exact_table_len, table_len, Table, ARENA_ALIGN, WRITES_TRACKED,
};
