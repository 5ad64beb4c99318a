package markersql

// PostgresCommitUnknown reports whether an error response to COMMIT with this
// SQLSTATE leaves the commit's outcome unknown. PostgreSQL answers a COMMIT it
// refused (a deferred constraint, a serialization failure) with an ERROR, and the
// transaction is rolled back. Some answers come from a server going away instead:
// the connection exception class 08, operator intervention 57 (57P01 admin shutdown
// arrives as a FATAL while the commit may have been written, and even reported as
// committed locally during a synchronous replication wait), system errors 58,
// internal errors XX, and 40003 statement completion unknown.
func PostgresCommitUnknown(sqlState string) bool {
	if sqlState == "40003" {
		return true
	}
	if len(sqlState) < 2 {
		return true // not a SQLSTATE: doubt is unknown
	}
	switch sqlState[:2] {
	case "08", "57", "58", "XX":
		return true
	}
	return false
}
