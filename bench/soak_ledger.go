package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/keys"
)

// The ledger is a redis-server of the soak's own, apart from the dedup Redis (which
// the soak restarts) and never faulted, so what the consumers write there outlives
// them. Per message i (0..messages-1) it holds two sets of claim tokens (each run of
// the handler runs under a claim whose random token dedup writes into the record):
//
//   - soak:fx:<i>, the side effect: the handler adds its claim's token, then returns
//     nil. A run that fails (an injected Nak) adds nothing.
//   - soak:ok:<i>, the commits: the consumer adds the token once dedup has
//     completed the claim (Complete returned nil: Processed), or reported the DONE
//     write failed (NotRecorded: the message is acked anyway).
//
// and the hashes soak:faults (what was injected) and soak:proc:<pid> (each consumer's
// counters, flushed every quarter second and at exit). Per consumer process, runs are
// also named "<i>:<token>" in two sets: soak:run:<pid>, the runs in hand (added as
// the handler starts, removed once dedup has completed or released the claim), read
// when the soak SIGKILLs the process; and soak:pfx:<pid>, the runs that made their
// side effect (added with it, atomically), which attribute uncommitted effects to
// the kill that left them.
const (
	ledgerPrefix   = "soak"
	ledgerFaults   = ledgerPrefix + ":faults"
	ledgerProgress = ledgerPrefix + ":progress" // commits so far: the fault schedule's clock
	soakHandler    = "soak"                     // the dedup handler's name
	soakIDPrefix   = "soak-"                    // Nats-Msg-Id of message i: soak-<i>
)

// Fields of soak:faults.
const (
	faultNaks      = "naks_injected"
	faultAckDrops  = "acks_dropped"
	faultExhausted = "exhausted"
)

func effectKey(i int) string { return ledgerPrefix + ":fx:" + strconv.Itoa(i) }
func commitKey(i int) string { return ledgerPrefix + ":ok:" + strconv.Itoa(i) }

// notRecordedKey holds the tokens of message i's commits whose DONE write failed.
func notRecordedKey(i int) string { return ledgerPrefix + ":nr:" + strconv.Itoa(i) }
func procKey(pid int) string      { return ledgerPrefix + ":proc:" + strconv.Itoa(pid) }

// runKey holds consumer pid's runs in hand; procEffectsKey its runs that made their
// side effect. Both hold runName entries.
func runKey(pid int) string         { return ledgerPrefix + ":run:" + strconv.Itoa(pid) }
func procEffectsKey(pid int) string { return ledgerPrefix + ":pfx:" + strconv.Itoa(pid) }

// runName names the run of message i under a claim token, in runKey and procEffectsKey.
func runName(i int, token string) string { return strconv.Itoa(i) + ":" + token }

// parseRunName reads a runName back; ok is false for anything else.
func parseRunName(s string) (i int, token string, ok bool) {
	n, token, found := strings.Cut(s, ":")
	i, err := strconv.Atoi(n)
	if !found || err != nil || i < 0 || token == "" {
		return 0, "", false
	}
	return i, token, true
}
func soakMsgID(i int) string { return soakIDPrefix + strconv.Itoa(i) }

// soakIndex reads the message number back from a Nats-Msg-Id; -1 if it is not one
// of the soak's.
func soakIndex(id string) int {
	s, ok := strings.CutPrefix(id, soakIDPrefix)
	n, err := strconv.Atoi(s)
	if !ok || err != nil || n < 0 {
		return -1
	}
	return n
}

// recordIndex reads the message number back from a record key (…:soak-<i>); -1 if
// it is not one of the soak's.
func recordIndex(recordKey string) int {
	j := strings.LastIndexByte(recordKey, ':')
	return soakIndex(recordKey[j+1:])
}

// ledgerState is what the soak reads back once the consumers are stopped: per
// message, the tokens of runs that made the side effect, the tokens the consumers
// committed, and the token of the DONE record in the dedup Redis ("" for none).
type ledgerState struct {
	effects, commits [][]string
	notRecorded      [][]string // the commits whose DONE write failed
	done             []string
}

// soakTally is the verdict over a ledgerState.
//
// A successful run of message i is one dedup took as the message's processing: its
// token is in soak:ok:<i> (the consumer saw Processed or NotRecorded) or is the token
// of i's DONE record (which covers a consumer killed between completing and writing
// soak:ok). Then:
//
//   - Lost: messages with no successful run that also made the side effect.
//   - DuplicateSuccesses: successful runs beyond the first, summed over messages,
//     less one for each NotRecorded success among them. A NotRecorded run is acked
//     but leaves no DONE record: if its ack is lost too (a consumer SIGKILLed before
//     its connection flushed the ack), the redelivery runs the message again. That is
//     the NotRecorded window the README's Limits name, counted in
//     NotRecordedRepeats, not a duplicate dedup claims to stop.
//   - Phantoms: successful runs without the side effect (a DONE or a commit for a run
//     that never made it): always a bug, and they do not save a message from Lost.
//   - Uncommitted: side effects of runs that never became successful. A consumer
//     SIGKILLed between the side effect and the DONE write leaves one, and so does a
//     run whose lease was lost; the message runs again, as at-least-once delivery
//     must. This is the crash window the README's Limits describe, not a duplicate
//     success, so it is reported and does not fail the soak.
type soakTally struct {
	Lost, DuplicateSuccesses, NotRecordedRepeats, Phantoms, Uncommitted int
}

// count computes the tally of l for messages 0..n-1.
func (l ledgerState) count(n int) soakTally {
	var t soakTally
	for i := range n {
		effects := soakAt(l.effects, i)
		success := slices.Clone(soakAt(l.commits, i))
		if i < len(l.done) && l.done[i] != "" {
			success = append(success, l.done[i])
		}
		slices.Sort(success)
		success = slices.Compact(success)
		real, notRecorded := 0, 0
		for _, tok := range success {
			if slices.Contains(effects, tok) {
				real++
				if slices.Contains(soakAt(l.notRecorded, i), tok) {
					notRecorded++
				}
			} else {
				t.Phantoms++
			}
		}
		if real == 0 {
			t.Lost++
		} else {
			extra := real - 1
			explained := min(extra, notRecorded)
			t.NotRecordedRepeats += explained
			t.DuplicateSuccesses += extra - explained
		}
		seen := map[string]bool{}
		for _, tok := range effects {
			if !seen[tok] && !slices.Contains(success, tok) {
				t.Uncommitted++
			}
			seen[tok] = true
		}
	}
	return t
}

// successful reports whether token's run of message i is a success (see soakTally).
func (l ledgerState) successful(i int, token string) bool {
	return slices.Contains(soakAt(l.commits, i), token) || (i < len(l.done) && l.done[i] == token)
}

// uncommitted counts the runs among runs (runName entries, each with its side effect
// made) that never became successful.
func (l ledgerState) uncommitted(runs []string) int {
	n := 0
	for _, r := range runs {
		if i, token, ok := parseRunName(r); ok && !l.successful(i, token) {
			n++
		}
	}
	return n
}

func soakAt(s [][]string, i int) []string {
	if i < len(s) {
		return s[i]
	}
	return nil
}

// readLedger reads the ledger sets of messages 0..n-1 and each message's record in
// the dedup Redis (prefix is the Deduper's), in pipelines of readBatch.
func readLedger(ctx context.Context, ledger, dedupRedis *redis.Client, prefix string, n int) (ledgerState, error) {
	const readBatch = 1000
	l := ledgerState{effects: make([][]string, n), commits: make([][]string, n),
		notRecorded: make([][]string, n), done: make([]string, n)}
	for lo := 0; lo < n; lo += readBatch {
		hi := min(lo+readBatch, n)
		fx := make([]*redis.StringSliceCmd, hi-lo)
		ok := make([]*redis.StringSliceCmd, hi-lo)
		nr := make([]*redis.StringSliceCmd, hi-lo)
		if _, err := ledger.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := lo; i < hi; i++ {
				fx[i-lo] = p.SMembers(ctx, effectKey(i))
				ok[i-lo] = p.SMembers(ctx, commitKey(i))
				nr[i-lo] = p.SMembers(ctx, notRecordedKey(i))
			}
			return nil
		}); err != nil {
			return l, fmt.Errorf("read the ledger: %w", err)
		}
		recs := make([]*redis.StringCmd, hi-lo)
		if _, err := dedupRedis.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := lo; i < hi; i++ {
				recs[i-lo] = p.Get(ctx, keys.RecordKey(prefix, soakHandler, soakMsgID(i)))
			}
			return nil
		}); err != nil && !errors.Is(err, redis.Nil) {
			return l, fmt.Errorf("read the dedup records: %w", err)
		}
		for i := lo; i < hi; i++ {
			l.effects[i] = fx[i-lo].Val()
			l.commits[i] = ok[i-lo].Val()
			l.notRecorded[i] = nr[i-lo].Val()
			l.done[i] = doneToken(recs[i-lo].Val())
		}
	}
	return l, nil
}

// doneToken returns the owner token of a DONE record value ("d:<token>:<fingerprint>"),
// or "" for anything else (no record, or a claim still IN PROGRESS).
func doneToken(v string) string {
	state, rest, ok := strings.Cut(v, ":")
	if !ok || state != "d" {
		return ""
	}
	token, _, _ := strings.Cut(rest, ":")
	return token
}
