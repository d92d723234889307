//! Environment settings (`TPU_RS_*`). Each consumer reads its variables
//! through a [`Lookup`], so the same parsing serves the process environment
//! and tests; a malformed value is an error naming the variable, never
//! silently replaced by a default.

use crate::error::{Error, Result};

/// Where settings come from: the value of a variable, `None` when unset.
pub type Lookup<'a> = &'a dyn Fn(&'static str) -> Result<Option<String>>;

/// The process environment as a [`Lookup`]. Empty counts as unset; a value
/// that is not UTF-8 is an error naming the variable.
pub fn env(name: &'static str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(invalid(name, &v.to_string_lossy(), "is not valid UTF-8"))
        }
    }
}

/// A positive integer (a count or a limit), e.g. `TPU_RS_DEFER_MAX_OPS`.
pub fn count(get: Lookup<'_>, name: &'static str) -> Result<Option<usize>> {
    get(name)?
        .map(|text| match text.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(invalid(name, &text, "must be a positive integer")),
        })
        .transpose()
}

/// A switch: `1`, `true`, `on` or `yes`; `0`, `false`, `off` or `no`.
pub fn switch(get: Lookup<'_>, name: &'static str) -> Result<Option<bool>> {
    get(name)?
        .map(|text| match text.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "on" | "yes" => Ok(true),
            "0" | "false" | "off" | "no" => Ok(false),
            _ => Err(invalid(name, &text, "must be on or off (1/0, true/false)")),
        })
        .transpose()
}

/// A size in bytes: an integer, optionally with a `K`, `M`, `G` or `T`
/// suffix (powers of 1024, `KiB` and `KB` spellings too).
pub fn bytes(get: Lookup<'_>, name: &'static str) -> Result<Option<u64>> {
    get(name)?
        .map(|text| {
            parse_bytes(&text).ok_or_else(|| {
                invalid(
                    name,
                    &text,
                    "must be a size in bytes (an integer, optionally with K, M, G or T)",
                )
            })
        })
        .transpose()
}

fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return None,
    };
    number.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// A comma-separated list whose every entry is one of `known`.
pub fn list(
    get: Lookup<'_>,
    name: &'static str,
    known: &[&'static str],
) -> Result<Vec<&'static str>> {
    let Some(text) = get(name)? else {
        return Ok(Vec::new());
    };
    text.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            known.iter().copied().find(|k| *k == entry).ok_or_else(|| {
                invalid(
                    name,
                    &text,
                    &format!("names unknown entry `{entry}`; use {}", known.join(", ")),
                )
            })
        })
        .collect()
}

/// The error for a malformed setting.
pub fn invalid(name: &'static str, value: &str, why: &str) -> Error {
    Error::InvalidOption {
        option: name,
        reason: format!("`{value}` {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(value: &'static str) -> impl Fn(&'static str) -> Result<Option<String>> {
        move |_| Ok(Some(value.to_string()))
    }

    #[test]
    fn counts_are_positive_integers_and_errors_name_the_variable() {
        assert_eq!(count(&one(" 12 "), "TPU_RS_X").unwrap(), Some(12));
        assert_eq!(count(&|_| Ok(None), "TPU_RS_X").unwrap(), None);
        for bad in ["abc", "0", "-3", "1.5", "99999999999999999999999"] {
            let err = count(&one(bad), "TPU_RS_DEFER_MAX_OPS")
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("TPU_RS_DEFER_MAX_OPS") && err.contains(bad),
                "{err}"
            );
        }
    }

    #[test]
    fn switches_take_common_spellings_and_reject_others() {
        for (text, want) in [
            ("1", true),
            (" On ", true),
            ("yes", true),
            ("0", false),
            ("OFF", false),
        ] {
            assert_eq!(
                switch(&one(text), "TPU_RS_X").unwrap(),
                Some(want),
                "{text}"
            );
        }
        assert_eq!(switch(&|_| Ok(None), "TPU_RS_X").unwrap(), None);
        let err = switch(&one("maybe"), "TPU_RS_CPU_ASYNC")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("TPU_RS_CPU_ASYNC") && err.contains("maybe"),
            "{err}"
        );
    }

    #[test]
    fn sizes_take_binary_suffixes_and_reject_overflow() {
        for (text, want) in [
            ("0", 0),
            ("4096", 4096),
            ("2K", 2048),
            ("3 MiB", 3 << 20),
            ("1g", 1 << 30),
        ] {
            assert_eq!(parse_bytes(text), Some(want), "{text}");
        }
        for bad in ["", "G", "1.5G", "12Q", "18446744073709551615K", "-1"] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
    }

    #[test]
    fn lists_reject_unknown_entries() {
        let known = ["nan", "parity"];
        assert_eq!(
            list(&one("nan, parity"), "TPU_RS_DEBUG_CHECKS", &known).unwrap(),
            known
        );
        let err = list(&one("nan,parrity"), "TPU_RS_DEBUG_CHECKS", &known).unwrap_err();
        assert!(err.to_string().contains("parrity"), "{err}");
    }
}
