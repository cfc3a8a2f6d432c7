//! The firmware's `defmt` logger: every log frame (encoded by `defmt`,
//! formatted only on the host) goes to the semihosting file [`LOG_FILE`]
//! in QEMU's working directory, one write per frame. `cargo xtask qemu`
//! (and the QEMU tests) decode the file with `defmt-decoder` and the ELF's
//! `.defmt` table; levels are chosen at build time with `DEFMT_LOG`
//! (xtask builds with `info` unless it is set).
//!
//! Any CPU may log: a frame is built under a spin lock in [`FRAME_MAX`]
//! bytes of buffer (a longer frame is written in pieces, still in one
//! piece of the file since the lock is held), and written when it ends.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicUsize, Ordering};

use semihosting::fs::File;
use semihosting::io::Write;

/// The semihosting file the frames go to.
pub const LOG_FILE: &core::ffi::CStr = c"defmt.out";
/// Bytes of a frame buffered before a write (frames are mostly far shorter).
const FRAME_MAX: usize = 512;
/// [`OWNER`] when no CPU holds the logger.
const FREE: usize = 0;

/// The CPU holding the logger, plus one; [`FREE`] if none does.
static OWNER: AtomicUsize = AtomicUsize::new(FREE);
/// The frame encoder (separate from [`FRAME`]: it writes into it).
static ENCODER: Owned<defmt::Encoder> = Owned(UnsafeCell::new(defmt::Encoder::new()));
static FRAME: Owned<Frame> = Owned(UnsafeCell::new(Frame {
    file: None,
    failed: false,
    buf: [0; FRAME_MAX],
    len: 0,
}));

/// The frame being built and where it goes.
struct Frame {
    /// Opened by the first frame.
    file: Option<File>,
    /// The file could not be opened or written: later frames are dropped.
    failed: bool,
    buf: [u8; FRAME_MAX],
    len: usize,
}

/// A value used only by the CPU that holds [`OWNER`].
struct Owned<T>(UnsafeCell<T>);

// SAFETY: the values are only touched between `acquire` and `release`, by
// the one CPU that won `OWNER` (acquire/release ordering on it hands them
// from one CPU to the next).
unsafe impl<T> Sync for Owned<T> {}

impl Frame {
    fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.len == FRAME_MAX {
                self.flush();
            }
            self.buf[self.len] = b;
            self.len += 1;
        }
    }

    fn flush(&mut self) {
        let len = core::mem::take(&mut self.len);
        if self.failed || len == 0 {
            return;
        }
        if self.file.is_none() {
            match File::create(LOG_FILE) {
                Ok(file) => self.file = Some(file),
                Err(_) => {
                    self.failed = true;
                    return;
                }
            }
        }
        if let Some(file) = &mut self.file {
            if file.write_all(&self.buf[..len]).is_err() {
                self.failed = true;
            }
        }
    }
}

/// This CPU's number (MPIDR_EL1.Aff0, as the boot code numbers CPUs).
fn this_cpu() -> usize {
    let mpidr: u64;
    // SAFETY: reading MPIDR_EL1 has no side effects; it touches no memory,
    // stack or flags, as the options declare.
    unsafe {
        core::arch::asm!("mrs {}, mpidr_el1", out(reg) mpidr, options(nomem, nostack, preserves_flags))
    };
    (mpidr & 0xff) as usize
}

/// Whether this CPU holds the logger (it panicked while logging: the
/// panic handler must not log, or it would wait for itself).
pub fn held_here() -> bool {
    OWNER.load(Ordering::Relaxed) == this_cpu() + 1
}

#[defmt::global_logger]
struct Logger;

// SAFETY: `acquire` spins until this CPU alone owns the encoder and the
// frame; `write`, `flush` and `release` are only called by defmt between
// `acquire` and `release` on the same CPU (their contract), and `release`
// frees them.
unsafe impl defmt::Logger for Logger {
    fn acquire() {
        let me = this_cpu() + 1;
        while OWNER
            .compare_exchange_weak(FREE, me, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            core::hint::spin_loop();
        }
        // SAFETY: this CPU owns the encoder until `release`, and `push`
        // touches only the frame.
        unsafe { &mut *ENCODER.0.get() }.start_frame(push);
    }

    unsafe fn flush() {
        // SAFETY: called between `acquire` and `release` (the trait's
        // contract): this CPU owns the frame.
        unsafe { &mut *FRAME.0.get() }.flush();
    }

    unsafe fn release() {
        // SAFETY: called after `acquire` on this CPU (the trait's contract).
        unsafe { &mut *ENCODER.0.get() }.end_frame(push);
        // SAFETY: as above; the encoder is done with the frame.
        unsafe { &mut *FRAME.0.get() }.flush();
        OWNER.store(FREE, Ordering::Release);
    }

    unsafe fn write(bytes: &[u8]) {
        // SAFETY: called between `acquire` and `release` (the trait's contract).
        unsafe { &mut *ENCODER.0.get() }.write(bytes, push);
    }
}

/// Adds encoded bytes to the frame (the encoder's output).
fn push(bytes: &[u8]) {
    // SAFETY: only called by the encoder inside `acquire`, `write` and
    // `release`, on the CPU that owns the frame; nothing else borrows the
    // frame meanwhile (the encoder is a separate value).
    unsafe { &mut *FRAME.0.get() }.push(bytes);
}

defmt::timestamp!("{=u64:us}", crate::clock::micros());
