package models_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// allModels is every GORM model of the package: one per table. A new
// table needs its model here (TestSchemaMatchesModels says so).
var allModels = []any{
	&models.AdminUser{},
	&models.APIToken{},
	&models.ConsoleSession{},
	&models.AdminAudit{},
	&models.PackageHost{},
	&models.PackageHostToken{},
	&models.Node{},
	&models.Invitation{},
	&models.NodeEvent{},
	&models.Workload{},
	&models.WorkloadOutput{},
	&models.NodeAudit{},
	&models.NodeStateCount{},
	&models.Command{},
	&models.Replica{},
	&models.Operation{},
	&models.OperationEvent{},
	&models.OperationOwner{},
	&models.OperationBody{},
	&models.ConfigDocument{},
	&models.SealedSecret{},
	&models.SecretDelivery{},
	&models.SecretAudit{},
	&models.RevealHandle{},
	&models.NodeConfigRow{},
}

// Tables the migrations tool owns.
var toolTables = map[string]bool{"goose_db_version": true, "sqlite_sequence": true}

// columnTypes are the database types a Go field type may be stored as.
var columnTypes = map[string]map[reflect.Kind][]string{
	models.SQLite: {
		reflect.String:  {"TEXT", "VARCHAR"},
		reflect.Int:     {"INTEGER", "BIGINT", "INT"},
		reflect.Int32:   {"INTEGER", "INT"},
		reflect.Int64:   {"INTEGER", "BIGINT"},
		reflect.Bool:    {"BOOLEAN", "INTEGER"},
		reflect.Float64: {"REAL", "DOUBLE"},
	},
	models.Postgres: {
		reflect.String:  {"TEXT", "VARCHAR", "JSONB", "JSON"},
		reflect.Int:     {"INT8", "INT4"},
		reflect.Int32:   {"INT4"},
		reflect.Int64:   {"INT8"},
		reflect.Bool:    {"BOOL"},
		reflect.Float64: {"FLOAT8", "NUMERIC"},
	},
}

// timeTypes are the column types of a time.Time: with a zone on Postgres,
// so no reader can take a UTC instant for local time.
var timeTypes = map[string][]string{
	models.SQLite:   {"DATETIME", "TIMESTAMP"},
	models.Postgres: {"TIMESTAMPTZ"},
}

// TestSchemaMatchesModels checks that the versioned SQL migrations and the
// GORM models agree on both dialects: every model's table exists, every
// field has its column with a compatible type, nullability matches the Go
// type (a pointer field needs a nullable column to store nil; a plain field
// cannot read NULL), and every table has a model.
func TestSchemaMatchesModels(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		covered := map[string]bool{}
		for _, m := range allModels {
			stmt := &gorm.Statement{DB: db.DB}
			require.NoError(t, stmt.Parse(m))
			table := stmt.Schema.Table
			covered[table] = true
			t.Run(table, func(t *testing.T) {
				require.True(t, db.Migrator().HasTable(table), "model %T: no table %s in the migrations", m, table)
				cols, err := db.Migrator().ColumnTypes(m)
				require.NoError(t, err)
				byName := map[string]gorm.ColumnType{}
				for _, c := range cols {
					byName[strings.ToLower(c.Name())] = c
				}
				for _, f := range stmt.Schema.Fields {
					if f.DBName == "" {
						continue
					}
					col, ok := byName[f.DBName]
					if !assertf(t, ok, "%T.%s: no column %s.%s", m, f.Name, table, f.DBName) {
						continue
					}
					goType := f.FieldType
					pointer := goType.Kind() == reflect.Pointer
					if pointer {
						goType = goType.Elem()
					}
					if nullable, ok := col.Nullable(); ok && !f.PrimaryKey {
						if pointer {
							assertf(t, nullable, "%T.%s is a pointer (may be nil) but %s.%s is NOT NULL", m, f.Name, table, f.DBName)
						} else {
							assertf(t, !nullable, "%T.%s cannot hold NULL but %s.%s is nullable", m, f.Name, table, f.DBName)
						}
					}
					dbType := strings.ToUpper(col.DatabaseTypeName())
					var want []string
					if goType == reflect.TypeFor[time.Time]() {
						want = timeTypes[db.Dialect]
					} else {
						want = columnTypes[db.Dialect][goType.Kind()]
					}
					if want != nil {
						assertf(t, contains(want, dbType), "%T.%s is %s but %s.%s is %s (want one of %v)",
							m, f.Name, goType, table, f.DBName, dbType, want)
					}
				}
			})
		}
		tables, err := db.Migrator().GetTables()
		require.NoError(t, err)
		for _, table := range tables {
			if toolTables[table] {
				continue
			}
			assertf(t, covered[table], "table %s has no model in models/schema_test.go's allModels", table)
		}
	})
}

func assertf(t *testing.T, ok bool, format string, args ...any) bool {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
	return ok
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
