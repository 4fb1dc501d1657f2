//! Dollar amounts as exact integer cents.
//!
//! Amounts arrive as JSON number text and are parsed as decimals, never through `f64`, so `0.29` is 29 cents and
//! not 28.999…; dollars go back out as `f64` only for display, where `cents / 100` prints as the decimal it is.

/// Why an amount was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AmountError {
    /// Not a decimal number, or finer than a cent: a malformed request.
    Malformed,
    /// Larger than any order could hold: the request is well formed but cannot be honoured.
    TooLarge,
}

/// Parses a JSON number (or the text of a JSON string holding one) in dollars into cents, exactly.
pub(crate) fn parse_cents(text: &str) -> Result<i64, AmountError> {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (mantissa, exp) = match rest.find(['e', 'E']) {
        Some(i) => {
            let e = &rest[i + 1..];
            let e = e.strip_prefix('+').unwrap_or(e);
            if e.is_empty() || e.len() > 6 || !e.trim_start_matches('-').bytes().all(|b| b.is_ascii_digit()) {
                return Err(AmountError::Malformed);
            }
            (&rest[..i], e.parse::<i32>().map_err(|_| AmountError::Malformed)?)
        }
        None => (rest, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits_ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() || !digits_ok(int) || !digits_ok(frac) || (mantissa.contains('.') && frac.is_empty()) {
        return Err(AmountError::Malformed);
    }
    // value = digits × 10^(exp − frac.len()); cents need the power + 2 to be reached without a remainder.
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    let mut power = exp + 2 - frac.len() as i32;
    if digits.is_empty() {
        return Ok(0);
    }
    let mut digits = digits.to_string();
    if power < 0 {
        let need = power.unsigned_abs() as usize;
        let zeros = digits.len() - digits.trim_end_matches('0').len();
        if zeros < need {
            return Err(AmountError::Malformed);
        }
        digits.truncate(digits.len() - need);
        power = 0;
    }
    if digits.len() as i32 + power.max(0) > 18 {
        return Err(AmountError::TooLarge);
    }
    let mut cents: i64 = digits.parse().map_err(|_| AmountError::Malformed)?;
    for _ in 0..power.max(0) {
        cents *= 10;
    }
    Ok(if negative { -cents } else { cents })
}

/// Cents as dollars for a JSON reply; exact for any amount an order can hold.
pub(crate) fn dollars(cents: i64) -> f64 {
    cents as f64 / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_exactly() {
        let ok = [
            ("200", 20000),
            ("200.0", 20000),
            ("200.00", 20000),
            ("0.29", 29),
            ("19.99", 1999),
            ("2e2", 20000),
            ("2E+2", 20000),
            ("1.5e1", 1500),
            ("12345e-2", 12345),
            ("1.000", 100),
            ("0", 0),
            ("0.000", 0),
            ("-5", -500),
            ("-0.01", -1),
            ("007", 700),
        ];
        for (text, cents) in ok {
            assert_eq!(parse_cents(text), Ok(cents), "{text}");
        }
        let malformed = [
            "", "-", "abc", "1.", ".5", "0.001", "1e-3", "1..2", "1e", "1e+", "0x10", " 1", "1.2.3", "NaN",
        ];
        for text in malformed {
            assert_eq!(parse_cents(text), Err(AmountError::Malformed), "{text}");
        }
        assert_eq!(parse_cents("1e30"), Err(AmountError::TooLarge));
        assert_eq!(parse_cents("99999999999999999999"), Err(AmountError::TooLarge));
    }

    #[test]
    fn dollars_print_as_decimals() {
        assert_eq!(serde_json::to_string(&dollars(20000)).unwrap(), "200.0");
        assert_eq!(serde_json::to_string(&dollars(1999)).unwrap(), "19.99");
        assert_eq!(serde_json::to_string(&dollars(29)).unwrap(), "0.29");
    }
}
