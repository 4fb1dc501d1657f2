//! ECMAScript `Number::toString` for doubles (ECMA-262 §6.1.6.1.20), as
//! required by RFC 8785 §3.2.2.3.

use alloc::string::String;

/// Appends the canonical ECMAScript form of a finite double to `out`:
/// `-0` -> `0`, `1e21` -> `1e+21`, `1e-7` -> `1e-7`, `0.000001` -> `0.000001`.
///
/// Digits are the shortest that round-trip (ties to even), from `ryu`. A
/// non-finite value (which no parsed [`Number`](super::Number) holds) is
/// written as `null`, as ECMAScript's `JSON.stringify` does.
pub fn format_number(v: f64, out: &mut String) {
    if !v.is_finite() {
        out.push_str("null");
        return;
    }
    if v == 0.0 {
        // Both zeros.
        out.push('0');
        return;
    }
    let mut ryu_buf = ryu::Buffer::new();
    let (digits, k, n) = decimal(ryu_buf.format_finite(v).as_bytes());
    let digits = &digits[..k];

    let mut buf = [0u8; 32];
    let mut len = 0;
    let mut put = |b: u8| {
        buf[len] = b;
        len += 1;
    };
    if v < 0.0 {
        put(b'-');
    }
    // The value is 0.d1..dk x 10^n.
    if k as i32 <= n && n <= 21 {
        // Integer: the digits, then n - k zeros.
        digits.iter().for_each(|&d| put(d));
        (k as i32..n).for_each(|_| put(b'0'));
    } else if 0 < n && n <= 21 {
        // Point inside the digits.
        let (int, frac) = digits.split_at(n as usize);
        int.iter().for_each(|&d| put(d));
        put(b'.');
        frac.iter().for_each(|&d| put(d));
    } else if -6 < n && n <= 0 {
        // "0." then -n zeros then the digits.
        put(b'0');
        put(b'.');
        (n..0).for_each(|_| put(b'0'));
        digits.iter().for_each(|&d| put(d));
    } else {
        // d[.ddd]e±(n-1)
        put(digits[0]);
        if k > 1 {
            put(b'.');
            digits[1..].iter().for_each(|&d| put(d));
        }
        put(b'e');
        let e = n - 1;
        put(if e < 0 { b'-' } else { b'+' });
        let e = e.unsigned_abs();
        if e >= 100 {
            put(b'0' + (e / 100) as u8);
        }
        if e >= 10 {
            put(b'0' + (e / 10 % 10) as u8);
        }
        put(b'0' + (e % 10) as u8);
    }
    // Only ASCII was written.
    if let Ok(s) = core::str::from_utf8(&buf[..len]) {
        out.push_str(s);
    }
}

/// Whether the decimal `int.frac x 10^exp` (JSON number grammar, `exp` an
/// optional sign then digits, possibly empty) is exactly the decimal that
/// the canonical form of `value` (its double) denotes. `1.50`, `1e2` and
/// `0.1` are; `9007199254740993` (canonical `9007199254740992`) and
/// `0.30000000000000001` (canonical `0.3`) are not.
pub(crate) fn denotes_its_double(int: &[u8], frac: &[u8], exp: &[u8], value: f64) -> bool {
    let digits = || int.iter().chain(frac).copied();
    let Some(first) = digits().position(|d| d != b'0') else {
        // A zero literal (any sign, any exponent) is the double zero.
        return value == 0.0;
    };
    if value == 0.0 {
        return false;
    }
    let last = match frac.iter().rposition(|&d| d != b'0') {
        Some(i) => int.len() + i,
        None => int.iter().rposition(|&d| d != b'0').unwrap_or(first),
    };
    let (exp_neg, exp_digits) = match exp.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, exp),
    };
    // Beyond this the double is zero or infinite, which was handled above.
    let e = exp_digits
        .iter()
        .fold(0i64, |e, &d| (e * 10 + i64::from(d - b'0')).min(1_000_000));
    let e = if exp_neg { -e } else { e };
    // The literal is 0.d(first)..d(last) x 10^n.
    let n = e + int.len() as i64 - first as i64;
    let mut ryu_buf = ryu::Buffer::new();
    let (shortest, k, m) = decimal(ryu_buf.format_finite(value).as_bytes());
    i64::from(m) == n
        && digits()
            .skip(first)
            .take(last + 1 - first)
            .eq(shortest[..k].iter().copied())
}

/// Splits ryu's output (`[-]ddd[.ddd][e[-]dd]`, non-zero) into significant
/// digits `d1..dk` (no leading or trailing zeros) and `n` such that the value
/// is `0.d1..dk x 10^n`.
fn decimal(s: &[u8]) -> ([u8; 24], usize, i32) {
    let mut digits = [0u8; 24];
    let mut k = 0usize;
    let mut seen = 0i32; // mantissa digits seen, leading zeros included
    let mut leading_zeros = 0i32;
    let mut int_len: Option<i32> = None;
    let mut i = usize::from(s.first() == Some(&b'-'));
    while i < s.len() {
        match s[i] {
            b'.' => int_len = Some(seen),
            b'0' if k == 0 => {
                leading_zeros += 1;
                seen += 1;
            }
            d @ b'0'..=b'9' => {
                if k < digits.len() {
                    digits[k] = d;
                    k += 1;
                }
                seen += 1;
            }
            _ => break, // 'e'
        }
        i += 1;
    }
    let int_len = int_len.unwrap_or(seen);
    let mut exp = 0i32;
    if i < s.len() {
        i += 1; // 'e'
        let neg = s.get(i) == Some(&b'-');
        if neg {
            i += 1;
        }
        for &d in &s[i..] {
            exp = exp * 10 + i32::from(d - b'0');
        }
        if neg {
            exp = -exp;
        }
    }
    while k > 1 && digits[k - 1] == b'0' {
        k -= 1;
    }
    (digits, k, int_len + exp - leading_zeros)
}

#[cfg(test)]
mod tests {
    use super::format_number;
    use alloc::string::String;

    fn fmt(v: f64) -> String {
        let mut s = String::new();
        format_number(v, &mut s);
        s
    }

    #[test]
    #[allow(clippy::excessive_precision)] // input spelled as in the vectors
    fn layouts() {
        let cases: &[(f64, &str)] = &[
            (0.0, "0"),
            (-0.0, "0"),
            (1.0, "1"),
            (-1.0, "-1"),
            (123.0, "123"),
            (1.5, "1.5"),
            (-1.5, "-1.5"),
            (0.1, "0.1"),
            (0.001234, "0.001234"),
            (0.000001, "0.000001"),
            (1e-7, "1e-7"),
            (1.5e-7, "1.5e-7"),
            (1e20, "100000000000000000000"),
            (1e21, "1e+21"),
            (1.5e21, "1.5e+21"),
            (123456789012345680000.0, "123456789012345680000"),
            (1e30, "1e+30"),
            (1e100, "1e+100"),
            (5e-324, "5e-324"),
            (-5e-324, "-5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (333333333.33333329, "333333333.3333333"),
            (4.5, "4.5"),
            (2e-3, "0.002"),
            (1e-27, "1e-27"),
            (9007199254740992.0, "9007199254740992"),
            (f64::NAN, "null"),
            (f64::INFINITY, "null"),
        ];
        for &(v, want) in cases {
            assert_eq!(fmt(v), want, "{v:e}");
        }
    }
}
