//! Writing an error's text into the fixed buffer of [`WspAicpuResult`].

use core::fmt;

use crate::args::{WspAicpuResult, WSP_AICPU_ERROR_LEN};

/// A `fmt::Write` into a fixed buffer that keeps the first
/// `WSP_AICPU_ERROR_LEN - 1` bytes (cut at a UTF-8 boundary) and drops
/// the rest.
pub struct Text<'a> {
    buf: &'a mut [u8; WSP_AICPU_ERROR_LEN],
    len: usize,
}

impl<'a> Text<'a> {
    /// An empty text over `buf`.
    pub fn new(buf: &'a mut [u8; WSP_AICPU_ERROR_LEN]) -> Self {
        buf[0] = 0;
        Text { buf, len: 0 }
    }
    /// Bytes written (without the NUL).
    pub fn len(&self) -> usize {
        self.len
    }
}

impl fmt::Write for Text<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = WSP_AICPU_ERROR_LEN - 1 - self.len;
        let mut take = s.len().min(room);
        while !s.is_char_boundary(take) {
            take -= 1;
        }
        self.buf[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take;
        self.buf[self.len] = 0;
        Ok(())
    }
}

/// Writes `status` and `error`'s text into `result`.
pub fn report(result: &mut WspAicpuResult, status: i32, error: impl fmt::Display) {
    let mut text = Text::new(&mut result.error);
    // `Text` never fails; a Display that fails leaves what it wrote.
    let _ = fmt::write(&mut text, format_args!("{error}"));
    result.error_len = text.len() as u32;
    result.status = status;
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::fmt::Write;

    #[test]
    fn truncates_at_a_char_boundary_and_terminates() {
        let mut buf = [0xAAu8; WSP_AICPU_ERROR_LEN];
        let mut t = Text::new(&mut buf);
        let long = "é".repeat(WSP_AICPU_ERROR_LEN);
        t.write_str(&long).unwrap();
        let n = t.len();
        assert_eq!(
            n,
            WSP_AICPU_ERROR_LEN - 2,
            "2-byte chars: one byte left unused"
        );
        assert_eq!(buf[n], 0);
        assert!(core::str::from_utf8(&buf[..n]).is_ok());
    }
}
