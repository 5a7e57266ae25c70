package pveemu

// Regenerate schema.json from the committed official extract:
//
//	go generate ./testvm/pveemu
//
// After a change of paths.txt, regenerate the extract from the full
// official schema first (it is checked against it when available, see
// schema_test.go):
//
//	go run ./internal/schemagen -in /path/to/apidata.json -paths paths.txt -extract testdata/apidata-extract.json -out schema.json
//
//go:generate go run ./internal/schemagen -in testdata/apidata-extract.json -paths paths.txt -out schema.json
