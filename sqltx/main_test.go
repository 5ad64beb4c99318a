package sqltx_test

import (
	"io"
	"log"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/dedupkit/dedupkit/internal/testenv"
)

func TestMain(m *testing.M) {
	// The proxy tests cut connections on purpose: the driver's log of it is noise.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	testenv.Main(m, nil)
}
