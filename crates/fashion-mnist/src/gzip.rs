//! Gzip decoding with every failure translated into a [`Corruption`].
//!
//! Input is an in-memory slice, so any error here is a property of the bytes,
//! never of the disk or network that delivered them.

use crate::error::Corruption;
use flate2::bufread::GzDecoder;
use std::io::{self, Read};

const SIGNATURE: [u8; 2] = [0x1f, 0x8b];

/// Decompresses a complete gzip file of at most `max_len` decompressed bytes.
///
/// Inflating stops one byte past `max_len`: a file that goes on (a gzip bomb
/// of a few MB inflates to gigabytes) comes back as those `max_len + 1`
/// bytes, unchecked past that point, for the IDX layer to reject as longer
/// than its header announces, so memory stays bounded by the expected size.
/// The limit counts the content of all members together.
///
/// A file of several gzip members one after the other (`cat a.gz b.gz`) is
/// one file, as `gzip -d` reads it: the content is that of all members in
/// turn, each member checked (CRC, length, truncation) like a single one.
/// Anything after the last member that does not start a new one is
/// rejected as trailing data: a damaged file, or junk appended to it.
pub(crate) fn decompress(gz: &[u8], max_len: usize) -> Result<Vec<u8>, Corruption> {
    let limit = max_len.saturating_add(1);
    let mut out = Vec::with_capacity(limit);
    let mut members = Members::new(gz)?;
    (&mut members)
        .take(limit as u64)
        .read_to_end(&mut out)
        .map_err(decode_error)?;
    if out.len() <= max_len {
        members.ensure_consumed()?;
    }
    Ok(out)
}

/// Streams the decompressed content of `gz` into `sink` chunk by chunk, so a
/// checksum can be computed without holding the whole content in memory.
pub(crate) fn for_each_chunk(gz: &[u8], mut sink: impl FnMut(&[u8])) -> Result<(), Corruption> {
    let mut members = Members::new(gz)?;
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        let read = members.read(&mut chunk).map_err(decode_error)?;
        if read == 0 {
            break;
        }
        sink(&chunk[..read]);
    }
    members.ensure_consumed()
}

/// The content of the gzip members at the start of a slice, one after the
/// other. Unlike `flate2`'s `MultiGzDecoder`, bytes after a member that do
/// not start with the gzip signature end the content instead of failing as
/// a bad header, so that [`Members::ensure_consumed`] reports them as
/// trailing data.
struct Members<'a> {
    member: GzDecoder<&'a [u8]>,
}

impl<'a> Members<'a> {
    fn new(gz: &'a [u8]) -> Result<Self, Corruption> {
        if gz.is_empty() {
            return Err(Corruption::Empty);
        }
        if !gz.starts_with(&SIGNATURE) {
            return Err(Corruption::NotGzip {
                found: gz.iter().take(2).copied().collect(),
            });
        }
        Ok(Members {
            member: GzDecoder::new(gz),
        })
    }

    /// Fails if bytes are left after the last member; call once reading
    /// has returned 0.
    fn ensure_consumed(self) -> Result<(), Corruption> {
        match self.member.get_ref().len() {
            0 => Ok(()),
            extra => Err(Corruption::TrailingGzipData { extra }),
        }
    }
}

impl Read for Members<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let read = self.member.read(buf)?;
            if read > 0 || buf.is_empty() {
                return Ok(read);
            }
            // This member is complete (its trailer checked); its reader
            // holds the bytes after it.
            let rest: &[u8] = self.member.get_ref();
            if !rest.starts_with(&SIGNATURE) {
                return Ok(0);
            }
            self.member = GzDecoder::new(rest);
        }
    }
}

fn decode_error(err: io::Error) -> Corruption {
    if err.kind() == io::ErrorKind::UnexpectedEof {
        Corruption::TruncatedGzip
    } else {
        Corruption::InvalidGzip {
            detail: err.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{decompress, for_each_chunk};
    use crate::error::Corruption;
    use flate2::Compression;
    use flate2::write::GzEncoder;
    use std::io::Write;

    /// A limit above every sample's length, for the tests that are not about it.
    const ROOMY: usize = 1 << 20;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
        encoder.write_all(data).expect("write to Vec");
        encoder.finish().expect("finish to Vec")
    }

    fn sample() -> Vec<u8> {
        (0..50_000u32).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn round_trips() {
        assert_eq!(decompress(&gzip(&sample()), ROOMY), Ok(sample()));
    }

    #[test]
    fn stops_one_byte_past_the_limit() {
        let bomb = gzip(&vec![0; 1 << 20]);
        assert_eq!(decompress(&bomb, 1000).map(|out| out.len()), Ok(1001));
        assert_eq!(decompress(&bomb, 1 << 20).map(|out| out.len()), Ok(1 << 20));
    }

    #[test]
    fn rejects_empty_input() {
        assert_eq!(decompress(&[], ROOMY), Err(Corruption::Empty));
    }

    #[test]
    fn rejects_non_gzip() {
        assert_eq!(
            decompress(b"PK\x03\x04", ROOMY),
            Err(Corruption::NotGzip {
                found: vec![b'P', b'K']
            })
        );
    }

    #[test]
    fn rejects_truncation_anywhere() {
        let gz = gzip(&sample());
        for cut in [3, 10, gz.len() / 2, gz.len() - 4, gz.len() - 1] {
            assert_eq!(
                decompress(&gz[..cut], ROOMY),
                Err(Corruption::TruncatedGzip),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn rejects_trailing_data() {
        let mut gz = gzip(&sample());
        gz.extend_from_slice(b"junk");
        assert_eq!(
            decompress(&gz, ROOMY),
            Err(Corruption::TrailingGzipData { extra: 4 })
        );
    }

    #[test]
    fn rejects_bad_crc() {
        let mut gz = gzip(&sample());
        let crc_byte = gz.len() - 8;
        gz[crc_byte] ^= 0xff;
        let err = decompress(&gz, ROOMY).unwrap_err();
        assert!(
            matches!(&err, Corruption::InvalidGzip { detail } if detail.contains("checksum")),
            "{err:?}"
        );
    }

    #[test]
    fn reads_concatenated_members_as_one_file() {
        let data = sample();
        let (head, tail) = data.split_at(12_345);
        let whole_then_empty = [gzip(&data), gzip(&[])].concat();
        let split_in_two = [gzip(head), gzip(tail)].concat();
        let with_empty_between = [gzip(head), gzip(&[]), gzip(tail)].concat();
        for gz in [&whole_then_empty, &split_in_two, &with_empty_between] {
            assert_eq!(decompress(gz, data.len()), Ok(data.clone()));
            let mut streamed = Vec::new();
            assert_eq!(
                for_each_chunk(gz, |c| streamed.extend_from_slice(c)),
                Ok(())
            );
            assert_eq!(streamed, data);
        }
    }

    #[test]
    fn checks_every_member() {
        let data = sample();
        let (head, tail) = data.split_at(20_000);
        let first = gzip(head);
        let second = gzip(tail);
        let two = [first.clone(), second.clone()].concat();
        // Truncated anywhere in the second member, its signature included.
        for cut in [
            first.len() + 1,
            first.len() + 10,
            two.len() - 4,
            two.len() - 1,
        ] {
            let err = decompress(&two[..cut], ROOMY);
            let expected = if cut == first.len() + 1 {
                Corruption::TrailingGzipData { extra: 1 }
            } else {
                Corruption::TruncatedGzip
            };
            assert_eq!(err, Err(expected), "cut at {cut}");
        }
        let mut bad_crc = two.clone();
        bad_crc[two.len() - 8] ^= 0xff;
        let err = decompress(&bad_crc, ROOMY).unwrap_err();
        assert!(
            matches!(&err, Corruption::InvalidGzip { detail } if detail.contains("checksum")),
            "{err:?}"
        );
        let mut junk_after = two;
        junk_after.extend_from_slice(b"junk");
        assert_eq!(
            decompress(&junk_after, ROOMY),
            Err(Corruption::TrailingGzipData { extra: 4 })
        );
    }

    #[test]
    fn the_limit_counts_all_members() {
        let small = gzip(&[7; 600]);
        let bomb = gzip(&vec![0; 1 << 20]);
        let gz = [small, bomb].concat();
        assert_eq!(decompress(&gz, 1000).map(|out| out.len()), Ok(1001));
    }
}
