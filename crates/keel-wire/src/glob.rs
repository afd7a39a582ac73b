//! Redis's glob patterns (`KEYS`, `SCAN ... MATCH`): `*` any run of bytes, `?` one
//! byte, `[abc]`, `[a-z]` and `[^...]` one byte of (or not of) a set, `\x` the byte `x`
//! itself. Bytes, not characters, as Redis matches them.

/// Whether `text` matches `pattern`.
pub fn matches(pattern: &[u8], text: &[u8]) -> bool {
    // Backtracking on the last `*` only: linear in practice, quadratic at worst, never
    // exponential (a pattern of many stars cannot blow up).
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
                continue;
            }
            Some(_) => {
                if let Some(next) = one(pattern, p, text[t]) {
                    p = next;
                    t += 1;
                    continue;
                }
            }
            None => {}
        }
        match star {
            Some((sp, st)) => {
                p = sp + 1;
                t = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

/// Whether the single-byte element of `pattern` at `p` (not a `*`) matches `byte`; the
/// position after the element if it does.
fn one(pattern: &[u8], p: usize, byte: u8) -> Option<usize> {
    match pattern[p] {
        b'?' => Some(p + 1),
        b'\\' if p + 1 < pattern.len() => (pattern[p + 1] == byte).then_some(p + 2),
        b'[' => class(pattern, p + 1, byte),
        other => (other == byte).then_some(p + 1),
    }
}

/// A `[...]` set opening before `start`: whether `byte` is in it, as Redis reads one (an
/// unclosed set runs to the pattern's end).
fn class(pattern: &[u8], start: usize, byte: u8) -> Option<usize> {
    let mut i = start;
    let negate = pattern.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut found = false;
    while i < pattern.len() && pattern[i] != b']' {
        if pattern[i] == b'\\' && i + 1 < pattern.len() {
            found |= pattern[i + 1] == byte;
            i += 2;
        } else if i + 2 < pattern.len() && pattern[i + 1] == b'-' && pattern[i + 2] != b']' {
            let (a, b) = (pattern[i].min(pattern[i + 2]), pattern[i].max(pattern[i + 2]));
            found |= (a..=b).contains(&byte);
            i += 3;
        } else {
            found |= pattern[i] == byte;
            i += 1;
        }
    }
    let end = if i < pattern.len() { i + 1 } else { i };
    (found != negate).then_some(end)
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn redis_glob_patterns() {
        let yes = [
            ("*", ""),
            ("*", "abc"),
            ("a*", "abc"),
            ("*c", "abc"),
            ("a*c", "abbbc"),
            ("h?llo", "hello"),
            ("h[ae]llo", "hallo"),
            ("h[^e]llo", "hallo"),
            ("h[a-b]llo", "hbllo"),
            ("key:*:x", "key:1:2:x"),
            ("\\*", "*"),
            ("a**b", "ab"),
        ];
        for (p, t) in yes {
            assert!(matches(p.as_bytes(), t.as_bytes()), "{p} {t}");
        }
        let no =
            [("a*", "b"), ("h[^e]llo", "hello"), ("h?llo", "hllo"), ("\\*", "a"), ("abc", "ab")];
        for (p, t) in no {
            assert!(!matches(p.as_bytes(), t.as_bytes()), "{p} {t}");
        }
        let stars = "*".repeat(50) + "b";
        assert!(!matches(stars.as_bytes(), "a".repeat(200).as_bytes()), "no blow-up");
    }
}
