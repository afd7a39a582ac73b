//! Strict decimal integers, as Redis reads them: an optional `-`, then digits without
//! leading zeros (`0` alone is zero), no `+`, no spaces, in range of i64.

/// Most bytes an i64 takes in decimal: a sign and 19 digits.
const I64_DIGITS_MAX: usize = 20;

/// Parses a strict decimal i64, or `None`.
pub(crate) fn parse_i64(bytes: &[u8]) -> Option<i64> {
    if bytes.is_empty() || bytes.len() > I64_DIGITS_MAX {
        return None;
    }
    let (negative, digits) = match bytes.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, bytes),
    };
    let first = *digits.first()?;
    if !first.is_ascii_digit() || (first == b'0' && (digits.len() > 1 || negative)) {
        return None;
    }
    // Accumulate negatively so i64::MIN parses without overflow.
    let mut value: i64 = 0;
    for &digit in digits {
        if !digit.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_sub(i64::from(digit - b'0'))?;
    }
    if negative {
        Some(value)
    } else {
        value.checked_neg()
    }
}

#[cfg(test)]
mod tests {
    use super::parse_i64;

    #[test]
    fn accepts_what_redis_accepts() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
    }

    #[test]
    fn refuses_what_redis_refuses() {
        for bad in
            [&b""[..], b"-", b"+1", b"01", b"-0", b" 1", b"1 ", b"1a", b"9223372036854775808"]
        {
            assert_eq!(parse_i64(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
