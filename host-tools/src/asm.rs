//! A program written instruction by instruction ([`Asm`]), for tests and
//! benches that exercise the device's program machine apart from the
//! workload language's lowering (see `device_runtime::abi::program` for
//! what each instruction means). Labels (a loop's `END`, a process's
//! `PROCESS_END`) are patched when the block is closed.

use device_runtime::abi::program::*;
use device_runtime::abi::Instr;
use zerocopy::byteorder::little_endian::U32;

use crate::table::TensorId;

/// `ARG` access: read.
pub const READ: u8 = 1;
/// `ARG` access: write.
pub const WRITE: u8 = 2;

/// A program under construction.
#[derive(Clone, Debug, Default)]
pub struct Asm {
    /// The instructions so far.
    pub code: Vec<Instr>,
}

impl Asm {
    /// Appends one instruction; returns its pc.
    pub fn op(&mut self, op: u8, r: u8, x: [u8; 6], imm: u32, imm2: u32) -> usize {
        self.code.push(Instr {
            op,
            r,
            x,
            imm: U32::new(imm),
            imm2: U32::new(imm2),
        });
        self.code.len() - 1
    }

    /// `r = value`.
    pub fn konst(&mut self, r: u8, value: i64) {
        self.op(OP_CONST, r, [NO_REG; 6], value as u32, (value >> 32) as u32);
    }

    /// `r = a op b` (`OP_ADD` .. `OP_EQ`).
    pub fn arith(&mut self, op: u8, r: u8, a: u8, b: u8) {
        self.op(op, r, [a, b, NO_REG, NO_REG, NO_REG, NO_REG], 0, 0);
    }

    /// Declares channel `c` of `capacity` tokens and `latency` ticks.
    pub fn channel(&mut self, c: u32, capacity: u32, latency: u32) {
        self.op(OP_CHANNEL, 0, [NO_REG; 6], c, capacity | latency << 8);
    }

    /// A `PROCESS` of `replicas` (a register, or `NO_REG` for one) with
    /// replica register `r` (or `NO_REG`), at most `most`; returns its pc,
    /// to close with [`process_end`](Self::process_end).
    pub fn process(&mut self, r: u8, replicas: u8, most: u32) -> usize {
        let x = [replicas, NO_REG, NO_REG, NO_REG, NO_REG, NO_REG];
        self.op(OP_PROCESS, r, x, 0, most)
    }

    /// Closes the `PROCESS` at `start`.
    pub fn process_end(&mut self, start: usize) {
        let end = self.op(OP_PROCESS_END, 0, [NO_REG; 6], start as u32, 0);
        self.code[start].imm = U32::new(end as u32);
    }

    /// A `LOOP` of `kind` ([`LOOP_PARALLEL`] or [`LOOP_SEQUENTIAL`]) with
    /// variable `r`, `count` iterations (a register), at most `most`;
    /// returns its pc, to close with [`end`](Self::end).
    pub fn looop(&mut self, r: u8, count: u8, kind: u8, most: u32) -> usize {
        let x = [count, kind, NO_REG, NO_REG, NO_REG, NO_REG];
        self.op(OP_LOOP, r, x, 0, most)
    }

    /// A `CONSUME` of channel `c` into register `r`; returns its pc, to
    /// close with [`end`](Self::end).
    pub fn consume(&mut self, r: u8, c: u32) -> usize {
        self.op(OP_CONSUME, r, [NO_REG; 6], c, 0)
    }

    /// Closes the `LOOP` or `CONSUME` at `start`.
    pub fn end(&mut self, start: usize) {
        let end = self.op(OP_END, 0, [NO_REG; 6], start as u32, 0) as u32;
        if self.code[start].op == OP_LOOP {
            self.code[start].imm = U32::new(end);
        } else {
            self.code[start].imm2 = U32::new(end);
        }
    }

    /// `SEND` on channel `c` the value of register `value` (or `NO_REG`: 0).
    pub fn send(&mut self, c: u32, value: u8) {
        let x = [value, NO_REG, NO_REG, NO_REG, NO_REG, NO_REG];
        self.op(OP_SEND, 0, x, c, 0);
    }

    /// A `CALL` of `kernel` on stream 0; its `ARG`s and `SCALAR`s follow.
    pub fn call(&mut self, kernel: u32) {
        self.op(
            OP_CALL,
            0,
            [0, NO_REG, NO_REG, NO_REG, NO_REG, NO_REG],
            kernel,
            0,
        );
    }

    /// An `ARG` of a 2-D tensor: a `rows` x `cols` tile (extent registers)
    /// at row `row` (a register, or `NO_REG` for 0), column 0.
    pub fn arg(&mut self, t: TensorId, access: u8, row: u8, rows: u8, cols: u8) {
        let x = [row, NO_REG, NO_REG, NO_REG, rows, cols];
        self.op(OP_ARG, access, x, t.0, 0);
    }
}
