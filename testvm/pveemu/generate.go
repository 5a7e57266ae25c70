package pveemu

// Regenerate schema.json from the shared official schema:
//
//	PVE_APIDATA=/path/to/apidata.json go generate ./testvm/pveemu
//
//go:generate go run ./internal/schemagen -paths paths.txt -out schema.json
