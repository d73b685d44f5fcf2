//! A bounds-checked little-endian reader over a byte slice.

use super::GgufError;

pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8], pos: usize) -> Self {
        Self { bytes, pos }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// The bytes from `start` up to the current position.
    pub(crate) fn slice_from(&self, start: usize) -> &'a [u8] {
        &self.bytes[start..self.pos]
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// Takes `n` bytes, or reports which item (`what`) ran past the end.
    pub(crate) fn take(
        &mut self,
        n: u64,
        what: impl FnOnce() -> String,
    ) -> Result<&'a [u8], GgufError> {
        let available = self.remaining() as u64;
        if n > available {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed: n,
                available,
            });
        }
        let start = self.pos;
        // n <= remaining, which fits in usize.
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    pub(crate) fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    pub(crate) fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A GGUF string: u64 byte length, then UTF-8 bytes without a terminator.
    pub(crate) fn string(&mut self, what: impl Fn() -> String) -> Result<&'a str, GgufError> {
        let len = self.u64(|| format!("{} (length)", what()))?;
        let bytes = self.take(len, &what)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 { what: what() })
    }
}
