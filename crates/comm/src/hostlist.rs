//! Expansion of SLURM host lists (`node[01-03,07],gpu5`), as
//! `scontrol show hostnames` does, so rank 0's host can be found without
//! calling out to SLURM tools.
//!
//! Grammar: a list is comma-separated items (commas inside brackets do not
//! separate items); an item is literal text and bracket groups; a group is
//! comma-separated numbers or `lo-hi` ranges. Ranges keep the zero padding
//! of their lower bound (`[08-10]` gives `08 09 10`). Several groups in one
//! item expand to every combination, leftmost group varying slowest
//! (`rack[1-2]-node[01-02]` gives `rack1-node01 rack1-node02 rack2-node01
//! rack2-node02`).

/// Refuse lists that would expand to more hosts than any cluster has,
/// instead of exhausting memory on a typo like `node[0-999999999]`.
const MAX_HOSTS: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid host list {list:?}: {reason}")]
pub struct HostlistError {
    pub list: String,
    pub reason: String,
}

/// All host names of `list`, in order.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, HostlistError> {
    let fail = |reason: String| HostlistError {
        list: list.to_string(),
        reason,
    };
    let mut hosts = Vec::new();
    for item in split_top_level(list).map_err(&fail)? {
        if item.is_empty() {
            return Err(fail("empty host name".to_string()));
        }
        let mut expanded = vec![String::new()];
        for piece in pieces(item).map_err(&fail)? {
            let choices = match piece {
                Piece::Text(t) => vec![t.to_string()],
                Piece::Group(g) => expand_group(g).map_err(&fail)?,
            };
            if expanded
                .len()
                .saturating_mul(choices.len())
                .saturating_add(hosts.len())
                > MAX_HOSTS
            {
                return Err(fail(format!("expands to more than {MAX_HOSTS} hosts")));
            }
            expanded = expanded
                .iter()
                .flat_map(|prefix| choices.iter().map(move |c| format!("{prefix}{c}")))
                .collect();
        }
        hosts.extend(expanded);
    }
    Ok(hosts)
}

/// The first host of `list`: where SLURM puts task 0 by default.
pub fn first_host(list: &str) -> Result<String, HostlistError> {
    expand_hostlist(list)?
        .into_iter()
        .next()
        .ok_or_else(|| HostlistError {
            list: list.to_string(),
            reason: "no hosts".to_string(),
        })
}

/// Splits at commas outside brackets; checks brackets balance and do not nest.
fn split_top_level(list: &str) -> Result<Vec<&str>, String> {
    let mut items = Vec::new();
    let mut depth = 0_u32;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(format!("nested '[' at byte {i}")),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(format!("unmatched ']' at byte {i}")),
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unclosed '['".to_string());
    }
    items.push(&list[start..]);
    Ok(items)
}

enum Piece<'a> {
    Text(&'a str),
    Group(&'a str),
}

/// Splits a balanced item into literal text and bracket-group contents.
fn pieces(item: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = item;
    while let Some(open) = rest.find('[') {
        if open > 0 {
            out.push(Piece::Text(&rest[..open]));
        }
        let close = rest[open..]
            .find(']')
            .map(|c| open + c)
            .ok_or_else(|| "unclosed '['".to_string())?;
        out.push(Piece::Group(&rest[open + 1..close]));
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        out.push(Piece::Text(rest));
    }
    Ok(out)
}

/// `01-03,07` → `01 02 03 07`.
fn expand_group(group: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for range in group.split(',') {
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        let number = |s: &str| -> Result<u64, String> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!(
                    "{range:?} in [{group}] is not a number or lo-hi range"
                ));
            }
            s.parse::<u64>()
                .map_err(|_| format!("{s:?} in [{group}] is too large"))
        };
        let (start, end) = (number(lo)?, number(hi)?);
        if end < start {
            return Err(format!("range {range:?} in [{group}] runs backwards"));
        }
        if end - start >= MAX_HOSTS as u64 {
            return Err(format!(
                "range {range:?} expands to more than {MAX_HOSTS} hosts"
            ));
        }
        let width = lo.len();
        out.extend((start..=end).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(list: &str) -> Vec<String> {
        expand_hostlist(list).unwrap()
    }

    #[test]
    fn single_host_and_plain_lists() {
        assert_eq!(expand("gpu5"), ["gpu5"]);
        assert_eq!(expand("a,b,c"), ["a", "b", "c"]);
    }

    #[test]
    fn ranges_and_singles_in_one_group_with_commas_inside_brackets() {
        assert_eq!(
            expand("node[01-03,07],gpu5"),
            ["node01", "node02", "node03", "node07", "gpu5"]
        );
    }

    #[test]
    fn suffix_after_group() {
        assert_eq!(expand("a[1-2]-ib,b"), ["a1-ib", "a2-ib", "b"]);
    }

    #[test]
    fn zero_padding_follows_the_lower_bound() {
        assert_eq!(expand("n[08-11]"), ["n08", "n09", "n10", "n11"]);
        assert_eq!(expand("n[8-11]"), ["n8", "n9", "n10", "n11"]);
        assert_eq!(expand("n[0098-0100]"), ["n0098", "n0099", "n0100"]);
        assert_eq!(expand("n[007]"), ["n007"]);
    }

    #[test]
    fn multiple_groups_expand_leftmost_slowest() {
        assert_eq!(
            expand("rack[1-2]-node[01-02]"),
            [
                "rack1-node01",
                "rack1-node02",
                "rack2-node01",
                "rack2-node02"
            ]
        );
        assert_eq!(
            expand("r[1,3]n[5-6],x[9]"),
            ["r1n5", "r1n6", "r3n5", "r3n6", "x9"]
        );
    }

    #[test]
    fn group_at_start_and_fqdn_text() {
        assert_eq!(
            expand("[1-2]x.cluster.org,login"),
            ["1x.cluster.org", "2x.cluster.org", "login"]
        );
    }

    #[test]
    fn first_host_is_the_first_expansion() {
        assert_eq!(first_host("node[03-04,01]").unwrap(), "node03");
        assert_eq!(first_host("gpu-a100-[12-13]").unwrap(), "gpu-a100-12");
    }

    #[test]
    fn malformed_lists_are_errors_that_quote_the_list() {
        for bad in [
            "node[1-3",
            "node1-3]",
            "node[[1]]",
            "node[3-1]",
            "node[a-b]",
            "node[]",
            "node[1-]",
            "node[,1]",
            "a,,b",
            "",
            "n[1-2][",
        ] {
            let err = expand_hostlist(bad).unwrap_err();
            assert_eq!(err.list, bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn absurd_expansions_are_refused() {
        assert!(expand_hostlist("n[0-99999999]").is_err());
        assert!(expand_hostlist("a[0-9999]b[0-9999]").is_err());
    }

    proptest::proptest! {
        #[test]
        fn expansion_matches_a_direct_enumeration(
            prefix in "[a-z]{1,5}",
            lo in 0_u32..200,
            len in 0_u32..20,
            width in 1_usize..5,
        ) {
            let hi = lo + len;
            let list = format!("{prefix}[{lo:0width$}-{hi}]");
            let expected: Vec<String> = (lo..=hi).map(|n| format!("{prefix}{n:0width$}")).collect();
            proptest::prop_assert_eq!(expand_hostlist(&list).unwrap(), expected);
        }
    }
}
