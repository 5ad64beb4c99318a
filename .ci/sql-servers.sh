# Sourced by .ci/run (which installs the packages): start PostgreSQL and MariaDB
# when nothing answers, as the SQL transactor tests (sqltx, pgxtx) need them, and
# make sure the database and the passwordless logins the test URLs name exist.
# Idempotent: a server that answers is left running as it is; only what is missing
# is created.
#
# ensure_postgres URL [CLUSTER]: URL as DEDUP_POSTGRES_URL (postgres://postgres@HOST:PORT/DB?…);
#   CLUSTER is the Debian cluster to start when nothing answers (default main).
# ensure_mariadb DSN [DATADIR] [SOCKET]: DSN as DEDUP_MYSQL_DSN (root@tcp(HOST:PORT)/DB);
#   DATADIR and SOCKET of the server to start when nothing answers (defaults
#   /var/lib/mysql and /run/mysqld/mysqld.sock).

sql_tcp_up() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

sql_wait_tcp() { # host port what
	for _ in $(seq 300); do
		sql_tcp_up "$1" "$2" && return 0
		sleep 0.1
	done
	echo "$3 does not answer on $1:$2"
	return 1
}

ensure_postgres() {
	local url=$1 cluster=${2:-main}
	local hostport=${url#*@} db
	hostport=${hostport%%/*}
	db=${url##*/}
	db=${db%%\?*}
	local host=${hostport%:*} port=${hostport##*:}
	if ! command -v pg_ctlcluster >/dev/null || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
		echo "PostgreSQL is not installed (.ci/run installs postgresql)"
		return 1
	fi
	local version
	version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1) || true
	[ -n "$version" ] || version=$(ls /usr/lib/postgresql | sort -V | tail -n 1) || true
	if ! sql_tcp_up "$host" "$port"; then
		if [ ! -d "/etc/postgresql/$version/$cluster" ]; then
			echo "creating PostgreSQL cluster $version/$cluster on port $port"
			pg_createcluster "$version" "$cluster" -p "$port" >/dev/null
		fi
		echo "nothing answers on $host:$port: starting PostgreSQL $version/$cluster"
		pg_ctlcluster --skip-systemctl-redirect "$version" "$cluster" start
		sql_wait_tcp "$host" "$port" PostgreSQL || return 1
	fi
	local psql=(psql -h "$host" -p "$port" -U postgres -w -X -q -At)
	if ! "${psql[@]}" -d postgres -c 'select 1' >/dev/null 2>&1; then
		# Debian's pg_hba asks TCP clients for a password: the tests log in as
		# postgres without one, on loopback only.
		local hba="/etc/postgresql/$version/$cluster/pg_hba.conf"
		echo "trusting loopback logins in $hba"
		local rules
		rules=$(printf 'host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n'; cat "$hba")
		printf '%s\n' "$rules" >"$hba" # in place: the file keeps its owner and mode
		pg_ctlcluster --skip-systemctl-redirect "$version" "$cluster" reload
		for _ in $(seq 50); do
			"${psql[@]}" -d postgres -c 'select 1' >/dev/null 2>&1 && break
			sleep 0.1
		done
	fi
	if [ "$("${psql[@]}" -d postgres -c "select 1 from pg_database where datname = '$db'")" != 1 ]; then
		echo "creating PostgreSQL database $db"
		"${psql[@]}" -d postgres -c "CREATE DATABASE \"$db\""
	fi
	"${psql[@]}" -d "$db" -c 'select version()'
}

ensure_mariadb() {
	local dsn=$1 datadir=${2:-/var/lib/mysql} socket=${3:-/run/mysqld/mysqld.sock}
	local hostport=${dsn#*@tcp(} db
	hostport=${hostport%%)*}
	db=${dsn#*)/}
	db=${db%%\?*}
	local host=${hostport%:*} port=${hostport##*:}
	if ! command -v mariadbd >/dev/null; then
		echo "MariaDB is not installed (.ci/run installs mariadb-server)"
		return 1
	fi
	if ! sql_tcp_up "$host" "$port"; then
		# The package's own start needs an init system; a fresh install may lack
		# the runtime directory and, where its postinst could not run, the
		# system tables.
		mkdir -p "$(dirname "$socket")"
		chown mysql:mysql "$(dirname "$socket")"
		if [ ! -d "$datadir/mysql" ]; then
			echo "initializing a MariaDB data directory in $datadir"
			mkdir -p "$datadir"
			chown mysql:mysql "$datadir"
			mysql_install_db --user=mysql --datadir="$datadir" --skip-test-db >/dev/null
		fi
		echo "nothing answers on $host:$port: starting mariadbd"
		local pidfile="${socket%.sock}.pid"
		start-stop-daemon --start --oknodo --background --pidfile "$pidfile" --exec /usr/sbin/mariadbd -- \
			--user=mysql --datadir="$datadir" --socket="$socket" --pid-file="$pidfile" \
			--log-error="$datadir/mariadbd.err" --bind-address="$host" --port="$port"
		sql_wait_tcp "$host" "$port" MariaDB || return 1
	fi
	local mysql=(mariadb --protocol=TCP -h "$host" -P "$port" -u root)
	if ! "${mysql[@]}" -e 'select 1' >/dev/null 2>&1; then
		# Debian's root logs in by unix_socket only: allow an empty password over
		# TCP too, for localhost and, where names are not resolved, 127.0.0.1.
		echo "allowing root without a password over TCP"
		mariadb --protocol=SOCKET --socket="$socket" -u root -e "
			ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('');
			CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED VIA mysql_native_password USING PASSWORD('');
			GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
			FLUSH PRIVILEGES;"
	fi
	"${mysql[@]}" -e "CREATE DATABASE IF NOT EXISTS \`$db\`"
	"${mysql[@]}" -N -e 'select version()'
}
