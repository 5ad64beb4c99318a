package testenv

import (
	"bytes"
	"sync"
)

// LogBuffer is a buffer for a slog handler to write into, safe for concurrent writes
// and reads: tests read what a logger wrote while goroutines may still log.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
