//! `LCS key1 key2 [LEN] [IDX [MINMATCHLEN n] [WITHMATCHLEN]]`: the longest common
//! subsequence of two strings, read together by one transaction of two gets (so both come
//! from the same state, as Redis's single-threaded read does).
//!
//! The table is Redis's dynamic program, `(len1 + 1) x (len2 + 1)` 32-bit cells; a pair
//! of strings whose table would pass [`LCS_TABLE_BYTES_MAX`] is refused, and a large
//! table is filled on a blocking thread, off the connections' runtime.

use super::mismatched;
use crate::driver::Sent;
use bytes::Bytes;
use keel_types::CommandResult;
use keel_wire::command::LcsForm;
use keel_wire::reply::error_frame;
use keel_wire::resp::Frame;

/// Largest table one `LCS` may build: 256 MiB, Redis's bound at its default
/// `proto-max-bulk-len` halved (a 16,384-byte pair of strings needs 1 GiB in Redis too).
pub const LCS_TABLE_BYTES_MAX: u64 = 256 << 20;
/// Tables of more cells than this are filled on a blocking thread.
const INLINE_CELLS_MAX: u64 = 1 << 20;

/// The reply of an `LCS` once its two gets (`sent`, one transaction) are answered.
pub(crate) async fn reply(sent: Sent, form: LcsForm) -> Frame {
    let (a, b) = match sent.answer().await.and_then(|r| r.result) {
        Ok(CommandResult::Multi { results: Some(results) }) => match &results[..] {
            [CommandResult::Value { value: a, .. }, CommandResult::Value { value: b, .. }] => {
                (a.clone().unwrap_or_default(), b.clone().unwrap_or_default())
            }
            _ => return mismatched("lcs"),
        },
        Ok(_) => return mismatched("lcs"),
        Err(e) => return error_frame(&e),
    };
    let cells = (a.len() as u64 + 1) * (b.len() as u64 + 1);
    if cells.saturating_mul(4) > LCS_TABLE_BYTES_MAX {
        return Frame::error(&format!(
            "ERR Insufficient memory, transient memory for LCS exceeds the limit of {LCS_TABLE_BYTES_MAX} bytes"
        ));
    }
    if cells <= INLINE_CELLS_MAX {
        return lcs_frame(&a, &b, form);
    }
    match tokio::task::spawn_blocking(move || lcs_frame(&a, &b, form)).await {
        Ok(frame) => frame,
        Err(_) => Frame::error("ERR internal: the LCS computation failed"),
    }
}

/// One matching range found walking back: `(a_start, a_end, b_start, b_end)`, inclusive.
type Range = (usize, usize, usize, usize);

/// The longest common subsequence of `a` and `b` as `form` asks for it.
pub fn lcs_frame(a: &[u8], b: &[u8], form: LcsForm) -> Frame {
    let (common, ranges) = lcs(a, b);
    if form.len {
        return Frame::Integer(common.len() as i64);
    }
    if !form.idx {
        return Frame::Bulk(Bytes::from(common));
    }
    let matches = ranges
        .into_iter()
        .filter(|r| (r.1 - r.0 + 1) as u64 >= form.min_match_len)
        .map(|(a0, a1, b0, b1)| {
            let pair = |x: usize, y: usize| Frame::Array(vec![int(x), int(y)]);
            let mut one = vec![pair(a0, a1), pair(b0, b1)];
            if form.with_match_len {
                one.push(int(a1 - a0 + 1));
            }
            Frame::Array(one)
        })
        .collect();
    Frame::Map(vec![
        (Frame::bulk("matches"), Frame::Array(matches)),
        (Frame::bulk("len"), Frame::Integer(common.len() as i64)),
    ])
}

fn int(n: usize) -> Frame {
    Frame::Integer(n as i64)
}

/// The subsequence and its contiguous matching ranges, from the strings' ends back (the
/// order Redis reports them in, with its tie-break: on equal lengths, step back in `b`).
fn lcs(a: &[u8], b: &[u8]) -> (Vec<u8>, Vec<Range>) {
    let width = a.len() + 1;
    let mut table = vec![0u32; width * (b.len() + 1)];
    let at = |i: usize, j: usize| j * width + i;
    for j in 1..=b.len() {
        for i in 1..=a.len() {
            table[at(i, j)] = if a[i - 1] == b[j - 1] {
                table[at(i - 1, j - 1)] + 1
            } else {
                table[at(i - 1, j)].max(table[at(i, j - 1)])
            };
        }
    }
    let len = table[at(a.len(), b.len())] as usize;
    let mut common = vec![0u8; len];
    let mut ranges = Vec::new();
    let (mut i, mut j, mut left) = (a.len(), b.len(), len);
    let mut current: Option<Range> = None;
    while i > 0 && j > 0 {
        if a[i - 1] == b[j - 1] {
            common[left - 1] = a[i - 1];
            left -= 1;
            current = Some(match current {
                // Contiguous with the range being grown: it extends backwards.
                Some((a0, a1, b0, b1)) if a0 == i && b0 == j => (a0 - 1, a1, b0 - 1, b1),
                Some(done) => {
                    ranges.push(done);
                    (i - 1, i - 1, j - 1, j - 1)
                }
                None => (i - 1, i - 1, j - 1, j - 1),
            });
            i -= 1;
            j -= 1;
            if i == 0 || j == 0 {
                ranges.extend(current.take());
            }
        } else {
            if table[at(i - 1, j)] > table[at(i, j - 1)] {
                i -= 1;
            } else {
                j -= 1;
            }
            ranges.extend(current.take());
        }
    }
    assert_eq!(left, 0, "the walk back fills the whole subsequence");
    (common, ranges)
}

#[cfg(test)]
mod tests {
    use super::lcs;

    #[test]
    fn lcs_finds_redis_example_and_its_ranges() {
        let (common, ranges) = lcs(b"ohmytext", b"mynewtext");
        assert_eq!(common, b"mytext");
        assert_eq!(ranges, vec![(4, 7, 5, 8), (2, 3, 0, 1)]);
        assert_eq!(lcs(b"", b"abc").0, b"");
        assert_eq!(lcs(b"abc", b"abc").1, vec![(0, 2, 0, 2)]);
    }
}
