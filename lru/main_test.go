package lru_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// golang-lru v2.0.7's expirable.LRU starts a cleanup goroutine it can
	// never stop; only the benchmark baselines create one.
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/hashicorp/golang-lru/v2/expirable.NewLRU[...].func1"))
}
