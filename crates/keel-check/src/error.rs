//! Errors of the history readers and of the command line.
//!
//! Every input error names the file and the line (1-based; 0 when the file could not be
//! opened) and says what was wrong. None of them is retryable: the input must change.

use std::fmt;

/// A history that could not be read: the file, the line and what was wrong.
///
/// Not retryable: reading the same bytes again gives the same error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct InputError {
    /// The file (as given by the caller; `<memory>` for in-memory input).
    pub file: String,
    /// The 1-based line; 0 when the error is not about one line (open failed).
    pub line: u64,
    /// What was wrong.
    pub message: String,
}

impl InputError {
    /// An error at `line` of `file`.
    pub fn new(file: &str, line: u64, message: impl Into<String>) -> InputError {
        InputError { file: file.to_string(), line, message: message.into() }
    }
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}:{}: {}", self.file, self.line, self.message)
        }
    }
}

/// Reads lines from a buffered reader with a bound on line length, counting lines.
///
/// Shared by the three readers so that each reports lines the same way.
pub(crate) struct LineSource<R> {
    reader: R,
    file: String,
    line: u64,
    buffer: Vec<u8>,
}

/// The longest line any reader accepts, in bytes (a bound, so a corrupt file with no
/// newline cannot exhaust memory).
pub const LINE_BYTES_MAX: usize = 4 * 1024 * 1024;

impl<R: std::io::BufRead> LineSource<R> {
    /// Lines of `reader`, reported as lines of `file`.
    pub(crate) fn new(reader: R, file: &str) -> LineSource<R> {
        LineSource { reader, file: file.to_string(), line: 0, buffer: Vec::new() }
    }

    /// The number of the line last returned.
    pub(crate) fn line(&self) -> u64 {
        self.line
    }

    /// An error at the current line.
    pub(crate) fn error(&self, message: impl Into<String>) -> InputError {
        InputError::new(&self.file, self.line, message)
    }

    /// The next line without its line ending, `None` at end of input.
    pub(crate) fn next_line(&mut self) -> Result<Option<String>, InputError> {
        use std::io::{BufRead, Read};
        self.buffer.clear();
        self.line += 1;
        let limit = (LINE_BYTES_MAX + 2) as u64;
        let read = (&mut self.reader)
            .take(limit)
            .read_until(b'\n', &mut self.buffer)
            .map_err(|e| self.error(format!("read failed: {e}")))?;
        if read == 0 {
            return Ok(None);
        }
        if self.buffer.last() == Some(&b'\n') {
            self.buffer.pop();
            if self.buffer.last() == Some(&b'\r') {
                self.buffer.pop();
            }
        }
        if self.buffer.len() > LINE_BYTES_MAX {
            return Err(self.error(format!("line longer than {LINE_BYTES_MAX} bytes")));
        }
        debug_assert!(!self.buffer.contains(&b'\n'));
        std::str::from_utf8(&self.buffer)
            .map(|text| Some(text.to_string()))
            .map_err(|e| InputError::new(&self.file, self.line, format!("not UTF-8: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_file_and_line() {
        let e = InputError::new("h.jsonl", 7, "bad");
        assert_eq!(e.to_string(), "h.jsonl:7: bad");
        let e = InputError::new("h.jsonl", 0, "cannot open");
        assert_eq!(e.to_string(), "h.jsonl: cannot open");
    }

    #[test]
    fn line_source_counts_lines_and_strips_endings() {
        let mut s = LineSource::new(&b"a\r\nb\n\nc"[..], "f");
        assert_eq!(s.next_line().unwrap().as_deref(), Some("a"));
        assert_eq!(s.next_line().unwrap().as_deref(), Some("b"));
        assert_eq!(s.next_line().unwrap().as_deref(), Some(""));
        assert_eq!(s.next_line().unwrap().as_deref(), Some("c"));
        assert_eq!(s.line(), 4);
        assert_eq!(s.next_line().unwrap(), None);
    }

    #[test]
    fn line_source_rejects_non_utf8_with_line() {
        let mut s = LineSource::new(&b"ok\n\xff\xfe\n"[..], "f");
        assert!(s.next_line().unwrap().is_some());
        let e = s.next_line().unwrap_err();
        assert_eq!((e.file.as_str(), e.line), ("f", 2));
    }
}
