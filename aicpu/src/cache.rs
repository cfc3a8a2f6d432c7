//! Making host-written memory visible to the AICPU before it reads it:
//! [`device_runtime::ascend::regs::clean_invalidate`] (`dc civac` per line,
//! `dsb sy`, `isb` on the device, as CANN's AICPU code does; nothing on a
//! hosted build).

pub use device_runtime::ascend::regs::clean_invalidate as invalidate;
