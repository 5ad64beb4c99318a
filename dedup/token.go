package dedup

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync/atomic"
)

// Owner tokens are a random per-process prefix and a counter: unique across processes
// with overwhelming probability, and cheaper than reading crypto/rand per claim.
var (
	tokenPrefix = newTokenPrefix()
	tokenSeq    atomic.Uint64
)

func newTokenPrefix() string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("dedup: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

func newToken() string {
	var b [24 + 1 + 13]byte
	n := copy(b[:], tokenPrefix)
	b[n] = '.'
	return string(strconv.AppendUint(b[:n+1], tokenSeq.Add(1), 36))
}
