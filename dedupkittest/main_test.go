package dedupkittest

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a server leaves a goroutine behind after Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
