//! Kubernetes quantities (`50m`, `0.5`, `128Mi`, `1e3`): one parser for the grammar check of the
//! spec (`check`, render) and for comparing amounts by value before an apply.

/// A Kubernetes quantity as an exact (mantissa, power of ten) with the mantissa not divisible by
/// ten, so equal values compare equal whatever the notation ("0.5" = "500m", "1Ki" = "1024").
/// None for anything that is not a quantity (by Kubernetes' grammar) or does not fit.
pub fn value(s: &str) -> Option<(i128, i32)> {
    let (number, suffix) =
        match s.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')) {
            Some(i) => s.split_at(i),
            None => (s, ""),
        };
    let (negative, digits) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty() && frac.is_empty()
        || !whole
            .chars()
            .chain(frac.chars())
            .all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let mut mantissa: i128 = 0;
    for c in whole.chars().chain(frac.chars()) {
        mantissa = mantissa
            .checked_mul(10)?
            .checked_add(i128::from(c.to_digit(10)?))?;
    }
    let mut exp10 = -i32::try_from(frac.len()).ok()?;
    let binary = |power: u32| 1i128.checked_shl(power);
    match suffix {
        "" => {}
        "n" => exp10 -= 9,
        "u" => exp10 -= 6,
        "m" => exp10 -= 3,
        "k" => exp10 += 3,
        "M" => exp10 += 6,
        "G" => exp10 += 9,
        "T" => exp10 += 12,
        "P" => exp10 += 15,
        "E" => exp10 += 18,
        "Ki" => mantissa = mantissa.checked_mul(binary(10)?)?,
        "Mi" => mantissa = mantissa.checked_mul(binary(20)?)?,
        "Gi" => mantissa = mantissa.checked_mul(binary(30)?)?,
        "Ti" => mantissa = mantissa.checked_mul(binary(40)?)?,
        "Pi" => mantissa = mantissa.checked_mul(binary(50)?)?,
        "Ei" => mantissa = mantissa.checked_mul(binary(60)?)?,
        e => {
            let exp = e.strip_prefix(['e', 'E'])?;
            exp10 = exp10.checked_add(exp.parse::<i32>().ok()?)?;
        }
    }
    if mantissa == 0 {
        return Some((0, 0));
    }
    while mantissa % 10 == 0 {
        mantissa /= 10;
        exp10 += 1;
    }
    Some((if negative { -mantissa } else { mantissa }, exp10))
}

/// Kubernetes' quantity grammar: a signed decimal number, then a binary (Ki..Ei) or decimal (n, u, m,
/// k, M, G, T, P, E) suffix or an integer exponent.
pub fn is_quantity(s: &str) -> bool {
    value(s).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_compare_by_value() {
        for (a, b) in [
            ("0.5", "500m"),
            ("1.5Gi", "1536Mi"),
            ("1Ki", "1024"),
            ("1e3", "1k"),
            ("1000m", "1"),
            ("100M", "1e8"),
            ("0", "0Mi"),
            ("+2", "2"),
        ] {
            assert_eq!(value(a), value(b), "{a} = {b}");
            assert!(value(a).is_some(), "{a}");
        }
        for (a, b) in [("1", "1m"), ("1Ki", "1k"), ("-1", "1"), ("1.5Gi", "1500Mi")] {
            assert_ne!(value(a), value(b), "{a} != {b}");
        }
        for bad in ["", "abc", "1x", "1.2.3", "Ki", "1e", "."] {
            assert_eq!(value(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_grammar_check_is_the_parser() {
        for ok in ["1n", "2u", "1e+3", "-1"] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in [
            "1e3.5",
            " 1",
            "1 ",
            "99999999999999999999999999999999999999999",
        ] {
            assert!(!is_quantity(bad), "{bad:?}");
        }
    }
}
