//! Stop strings against a brute-force reference: after every piece, search the whole text so
//! far for every stop string.

use akunu_core::stop::{StopMatcher, StopOutput};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What the stream must look like after the text `seen`: `Err((index, emitted))` once a stop
/// string occurs (the earliest, first listed on a tie), else `Ok(emitted)` with everything
/// emitted except the longest suffix that is a proper prefix of a stop string.
fn reference(seen: &str, stops: &[String]) -> Result<String, (usize, String)> {
    let earliest = stops
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.is_empty())
        .filter_map(|(i, s)| seen.find(s.as_str()).map(|at| (at, i)))
        .min();
    if let Some((at, i)) = earliest {
        return Err((i, seen[..at].to_string()));
    }
    let held_from = (0..seen.len())
        .filter(|&k| seen.is_char_boundary(k))
        .find(|&k| {
            stops
                .iter()
                .any(|s| s.len() > seen.len() - k && s.starts_with(&seen[k..]))
        })
        .unwrap_or(seen.len());
    Ok(seen[..held_from].to_string())
}

/// Runs `pieces` through a matcher and the reference side by side.
fn check(stops: &[String], pieces: &[String]) {
    let mut matcher = StopMatcher::new(stops);
    let mut seen = String::new();
    let mut emitted = String::new();
    for (j, piece) in pieces.iter().enumerate() {
        seen.push_str(piece);
        let out = matcher.push(piece);
        emitted.push_str(&out.text);
        let ctx = || format!("stops {stops:?}, pieces {pieces:?}, after piece {j}");
        match reference(&seen, stops) {
            Ok(expected) => {
                assert_eq!(out.stop, None, "{}", ctx());
                assert_eq!(emitted, expected, "{}", ctx());
            }
            Err((index, expected)) => {
                assert_eq!(out.stop, Some(index), "{}", ctx());
                assert!(out.stopped() && matcher.is_stopped());
                assert_eq!(emitted, expected, "{}", ctx());
                for later in &pieces[j + 1..] {
                    assert_eq!(matcher.push(later), StopOutput::default());
                }
                assert_eq!(matcher.finish(), "", "{}", ctx());
                return;
            }
        }
    }
    emitted.push_str(&matcher.finish());
    assert_eq!(emitted, seen, "stops {stops:?}, pieces {pieces:?}");
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

const ALPHABET: [char; 7] = ['a', 'b', 'c', ' ', 'é', '日', '🦀'];

fn random_text(rng: &mut StdRng, max_chars: usize) -> String {
    let len = rng.random_range(0..=max_chars);
    (0..len)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())])
        .collect()
}

/// Splits `text` at random character boundaries, empty pieces included.
fn random_pieces(rng: &mut StdRng, text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < chars.len() {
        let take = rng.random_range(0..=4.min(chars.len() - at));
        pieces.push(chars[at..at + take].iter().collect());
        at += take;
    }
    if rng.random_bool(0.2) {
        pieces.push(String::new());
    }
    pieces
}

#[test]
fn random_streams_match_the_reference() {
    let mut rng = StdRng::seed_from_u64(1);
    for _ in 0..20_000 {
        let n_stops = rng.random_range(0..4);
        let stops: Vec<String> = (0..n_stops).map(|_| random_text(&mut rng, 4)).collect();
        let text = random_text(&mut rng, 40);
        let pieces = random_pieces(&mut rng, &text);
        check(&stops, &pieces);
    }
}

/// Texts built to contain a stop string, or nearly: a near miss drops its last character.
#[test]
fn random_streams_with_planted_stops() {
    let mut rng = StdRng::seed_from_u64(2);
    for _ in 0..20_000 {
        let stops: Vec<String> = (0..rng.random_range(1..4))
            .map(|_| {
                let s = random_text(&mut rng, 5);
                if s.is_empty() {
                    "ab".to_string()
                } else {
                    s
                }
            })
            .collect();
        let mut text = random_text(&mut rng, 10);
        for _ in 0..rng.random_range(1..4) {
            let stop = &stops[rng.random_range(0..stops.len())];
            let mut planted: Vec<char> = stop.chars().collect();
            if rng.random_bool(0.5) {
                planted.pop();
            }
            text.extend(planted);
            text.push_str(&random_text(&mut rng, 3));
        }
        let pieces = random_pieces(&mut rng, &text);
        check(&stops, &pieces);
    }
}

#[test]
fn stop_split_over_many_pieces() {
    let stops = strings(&["<|end|>"]);
    let mut m = StopMatcher::new(&stops);
    assert_eq!(m.push("Hello <").text, "Hello ");
    for piece in ["|", "en", "d|"] {
        assert_eq!(m.push(piece), StopOutput::default());
    }
    let out = m.push("> trailing");
    assert_eq!(
        out,
        StopOutput {
            text: String::new(),
            stop: Some(0)
        }
    );
    assert_eq!(m.finish(), "");
}

#[test]
fn false_start_is_released() {
    let mut m = StopMatcher::new(&strings(&["<|end|>"]));
    assert_eq!(m.push("a <|en").text, "a ");
    assert_eq!(m.push("x").text, "<|enx");
    assert_eq!(m.push("<").text, "");
    assert_eq!(m.finish(), "<");
}

#[test]
fn overlapping_and_several_stops() {
    // "ab" starts first.
    let stops = strings(&["bc", "ab"]);
    let out = StopMatcher::new(&stops).push("xabc");
    assert_eq!(
        out,
        StopOutput {
            text: "x".into(),
            stop: Some(1)
        }
    );

    // Char by char, "ab" completes first.
    let mut m = StopMatcher::new(&stops);
    assert_eq!(m.push("x").text, "x");
    assert_eq!(m.push("a").text, "");
    assert_eq!(
        m.push("b"),
        StopOutput {
            text: String::new(),
            stop: Some(1)
        }
    );

    // A stop that completes first wins over a longer one that began earlier but is unfinished.
    let mut m = StopMatcher::new(&strings(&["abcd", "c"]));
    assert_eq!(m.push("ab").text, "");
    assert_eq!(
        m.push("c"),
        StopOutput {
            text: "ab".into(),
            stop: Some(1)
        }
    );

    // Two stops at the same place: the first listed.
    let out = StopMatcher::new(&strings(&["xyz", "xy"])).push("00xyz");
    assert_eq!(
        out,
        StopOutput {
            text: "00".into(),
            stop: Some(0)
        }
    );
}

#[test]
fn multibyte_characters_are_never_split() {
    let mut m = StopMatcher::new(&strings(&["日本", "é!"]));
    assert_eq!(m.push("x日").text, "x");
    assert_eq!(
        m.push("本y"),
        StopOutput {
            text: String::new(),
            stop: Some(0)
        }
    );

    let mut m = StopMatcher::new(&strings(&["é!"]));
    assert_eq!(m.push("café").text, "caf");
    assert_eq!(m.push("?").text, "é?");

    // A stop whose first byte is shared with another character.
    let mut m = StopMatcher::new(&strings(&["é"]));
    assert_eq!(m.push("è").text, "è");
}

#[test]
fn empty_and_missing_stops() {
    let mut m = StopMatcher::new(&strings(&["", "z"]));
    assert_eq!(
        m.push("abc"),
        StopOutput {
            text: "abc".into(),
            stop: None
        }
    );
    assert_eq!(
        m.push("yz"),
        StopOutput {
            text: "y".into(),
            stop: Some(1)
        }
    );

    let mut none = StopMatcher::new(&[]);
    assert_eq!(none.push("anything").text, "anything");
    assert_eq!(none.finish(), "");

    let mut only_empty = StopMatcher::new(&strings(&[""]));
    assert_eq!(only_empty.push("abc").text, "abc");
}

#[test]
fn a_stop_as_long_as_everything_held_matches_on_its_last_piece() {
    // The matcher searches only for stops that fit the pending text, so the stop is first
    // looked for when the held text reaches its full length, and must be found then.
    let stop = "ab".repeat(500);
    let stops = vec![stop, "x".repeat(1 << 20), "END".to_string()];
    check(&stops, &vec!["ab".to_string(); 501]);
    check(&stops, &["q", "ab", "E", "N", "Dab"].map(String::from));
}
