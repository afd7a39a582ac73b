//! Inline commands: what telnet users and `redis-cli` in some modes send, one line of
//! space-separated words. Words may be quoted as Redis quotes them:
//! - `"..."`: escapes `\n \r \t \b \a \\ \"` and `\xHH`; any other `\c` is `c`.
//! - `'...'`: only `\'` is an escape.
//! - A closing quote must be followed by a space or the end of the line.
//! - A quote may open in the middle of a word (`a"b c"` is the one word `ab c`).
//! - Words are separated by ASCII whitespace; every other byte, NUL included, is part of
//!   a word.

use super::ProtocolError;

/// Splits one inline line (without its line end) into words. The loop visits each byte
/// at most once, so it is bounded by the line's length, itself bounded by the decoder.
pub(super) fn split(line: &[u8]) -> Result<Vec<Vec<u8>>, ProtocolError> {
    let mut words = Vec::new();
    let mut at = 0;
    loop {
        while at < line.len() && is_space(line[at]) {
            at += 1;
        }
        if at == line.len() {
            debug_assert!(words.len() <= line.len());
            return Ok(words);
        }
        let (word, next) = word(line, at)?;
        assert!(next > at, "every word consumes at least one byte");
        words.push(word);
        at = next;
    }
}

/// Whitespace between words, as C's `isspace`.
fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// Where a word is while it is read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Quote {
    None,
    Double,
    Single,
}

/// Reads the word starting at `at` (not a space); returns it and the index after it.
fn word(line: &[u8], mut at: usize) -> Result<(Vec<u8>, usize), ProtocolError> {
    let mut word = Vec::new();
    let mut quote = Quote::None;
    loop {
        let Some(&byte) = line.get(at) else {
            if quote == Quote::None {
                return Ok((word, at));
            }
            return Err(ProtocolError::UnbalancedQuotes);
        };
        let next = line.get(at + 1).copied();
        match quote {
            Quote::None => match byte {
                b' ' | b'\n' | b'\r' | b'\t' | 0x0b | 0x0c => return Ok((word, at)),
                b'"' => quote = Quote::Double,
                b'\'' => quote = Quote::Single,
                _ => word.push(byte),
            },
            Quote::Double => match (byte, next) {
                (b'\\', Some(b'x')) if hex_pair(line, at + 2).is_some() => {
                    word.push(hex_pair(line, at + 2).unwrap_or_default());
                    at += 3;
                }
                (b'\\', Some(escaped)) => {
                    word.push(unescape(escaped));
                    at += 1;
                }
                (b'"', _) => return close_quote(line, at, word),
                _ => word.push(byte),
            },
            Quote::Single => match (byte, next) {
                (b'\\', Some(b'\'')) => {
                    word.push(b'\'');
                    at += 1;
                }
                (b'\'', _) => return close_quote(line, at, word),
                _ => word.push(byte),
            },
        }
        at += 1;
    }
}

/// A closing quote at `at` ends the word; it must be followed by a space or the end.
fn close_quote(line: &[u8], at: usize, word: Vec<u8>) -> Result<(Vec<u8>, usize), ProtocolError> {
    match line.get(at + 1) {
        None => Ok((word, at + 1)),
        Some(&after) if is_space(after) => Ok((word, at + 1)),
        Some(_) => Err(ProtocolError::UnbalancedQuotes),
    }
}

/// The byte a backslash escape inside double quotes stands for.
fn unescape(escaped: u8) -> u8 {
    match escaped {
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        b'b' => 0x08,
        b'a' => 0x07,
        other => other,
    }
}

/// Two hex digits at `at`, as one byte.
fn hex_pair(line: &[u8], at: usize) -> Option<u8> {
    let high = char::from(*line.get(at)?).to_digit(16)?;
    let low = char::from(*line.get(at + 1)?).to_digit(16)?;
    u8::try_from(high * 16 + low).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        split(line.as_bytes()).unwrap().into_iter().map(|w| String::from_utf8(w).unwrap()).collect()
    }

    #[test]
    fn plain_words_split_on_spaces() {
        assert_eq!(words("SET  k v"), ["SET", "k", "v"]);
        assert_eq!(words("  "), Vec::<String>::new());
        assert_eq!(words("\tPING\t"), ["PING"]);
    }

    #[test]
    fn quotes_and_escapes_follow_redis() {
        assert_eq!(words(r#"SET "a b" 'c d'"#), ["SET", "a b", "c d"]);
        assert_eq!(words(r#""\x41\n\"" 'it\'s'"#), ["A\n\"", "it's"]);
        assert_eq!(words(r#"a"b c""#), ["ab c"]);
        assert_eq!(words(r#""\xZZ""#), ["xZZ"]);
        assert_eq!(words(r#""""#), [""]);
        assert_eq!(words("a\u{0}b\u{b}c"), ["a\u{0}b", "c"]);
    }

    #[test]
    fn unbalanced_quotes_are_refused() {
        for bad in [r#"SET "a"#, "SET 'a", r#""a"b"#, "'a'b", r#""a\"#] {
            assert_eq!(split(bad.as_bytes()), Err(ProtocolError::UnbalancedQuotes), "{bad}");
        }
    }
}
